"""Hugging Face token lookup. The token is only ever passed on in a child's environment.

Sources, first found wins: the file given by --hf-token-file (what the user asked for on this command
wins over the environment), the HF_TOKEN environment variable, the file named by HF_TOKEN_PATH, then the
Hugging Face CLI's default `~/.cache/huggingface/token`.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainkit.errors import SpecError


def _token_files() -> list[Path]:
    candidates = []
    if os.environ.get("HF_TOKEN_PATH"):
        candidates.append(Path(os.environ["HF_TOKEN_PATH"]).expanduser())
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    candidates.append(hf_home / "token")
    return candidates


def resolve_hf_token(token_file: str | None = None) -> str | None:
    if token_file:
        path = Path(token_file).expanduser()
        if not path.is_file():
            raise SpecError(f"--hf-token-file {token_file} does not exist; write your token there or set HF_TOKEN")
        if not path.read_text().strip():
            raise SpecError(f"--hf-token-file {token_file} is empty; write your token there or set HF_TOKEN")
        return path.read_text().strip()
    if os.environ.get("HF_TOKEN", "").strip():
        return os.environ["HF_TOKEN"].strip()
    for path in _token_files():
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
    return None


def require_hf_token(weights: str, token_file: str | None) -> str:
    token = resolve_hf_token(token_file)
    if token is None:
        raise SpecError(
            f"--init pretrained downloads {weights} from the Hugging Face hub, which needs an access token: "
            "set HF_TOKEN in the environment, or write the token to ~/.cache/huggingface/token "
            "(or a file passed with --hf-token-file). Never pass the token itself on the command line."
        )
    return token


def hf_token_to_store(token_file: str | None) -> str:
    """The token from a file, HF_TOKEN or a hidden prompt (never from the command line), for the cluster's Secret
    (`invoke secrets.hf-token` hands it to the EKS backend)."""
    import getpass
    import sys

    token = resolve_hf_token(token_file)
    if token is None:
        if not sys.stdin.isatty():
            raise SpecError("no Hugging Face token found: pass --file with a file holding it, or set HF_TOKEN")
        token = getpass.getpass("Hugging Face token (input hidden): ").strip()
    if not token:
        raise SpecError("the Hugging Face token is empty; nothing was created")
    return token
