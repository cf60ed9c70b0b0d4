"""`python -m trainkit ...`: the same commands as `invoke ...` in a checkout."""

from .tasks import main

main()
