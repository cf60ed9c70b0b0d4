"""`python -m trainkit ...`: the same commands as `invoke ...` in a checkout."""

from trainkit.cli import main

if __name__ == "__main__":
    main()
