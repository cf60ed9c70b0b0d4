"""Write a Terraform CLI config that installs hashicorp/aws from a local mirror when there is one.

Terraform looks for providers in the registry unless told otherwise. On machines that carry a
filesystem mirror (air-gapped hosts, CI images) we point `provider_installation` at it, so
`terraform init` works with no network; elsewhere the config falls back to the registry.

Mirror discovery, first hit wins: $TRAINKIT_TF_PROVIDER_MIRROR; Terraform's standard implied mirror
directories; then a bounded search of a few system roots for `registry.terraform.io/hashicorp/aws`.
Nothing machine-specific is committed: the config is written at run time under `.trainkit/`.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainkit.paths import make_folder

PROVIDER = "registry.terraform.io/hashicorp/aws"
MIRROR_ENV = "TRAINKIT_TF_PROVIDER_MIRROR"
SEARCH_ROOTS = ("/opt", "/usr/local", "/usr/share", "/srv", "/var/lib")
SEARCH_DEPTH = 3  # directories below a root before `registry.terraform.io`


def _implied_mirror_dirs() -> list[Path]:
    """Terraform's implied local mirror directories on Linux (CLI configuration docs)."""
    home = Path.home()
    data_home = Path(os.environ.get("XDG_DATA_HOME", home / ".local" / "share"))
    data_dirs = os.environ.get("XDG_DATA_DIRS", "/usr/local/share:/usr/share").split(":")
    return [home / ".terraform.d" / "plugins", data_home / "terraform" / "plugins"] + [
        Path(d) / "terraform" / "plugins" for d in data_dirs if d
    ]


def _has_provider(mirror: Path) -> bool:
    return (mirror / PROVIDER).is_dir()


def _search(root: Path, depth: int) -> Path | None:
    if _has_provider(root):
        return root
    if depth == 0:
        return None
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return None
    for child in children:
        found = _search(child, depth - 1)
        if found:
            return found
    return None


def find_provider_mirror() -> Path | None:
    if os.environ.get(MIRROR_ENV):
        path = Path(os.environ[MIRROR_ENV])
        return path if _has_provider(path) else None
    for candidate in _implied_mirror_dirs():
        if _has_provider(candidate):
            return candidate
    for root in SEARCH_ROOTS:
        found = _search(Path(root), SEARCH_DEPTH)
        if found:
            return found
    return None


def render_cli_config(mirror: Path | None) -> str:
    if mirror is None:
        return "# No local provider mirror found: providers come from the registry.\n" + (
            "provider_installation {\n  direct {}\n}\n"
        )
    return (
        f"# hashicorp/aws from the local mirror found at run time; everything else from the registry.\n"
        f"provider_installation {{\n"
        f"  filesystem_mirror {{\n"
        f'    path    = "{mirror}"\n'
        f'    include = ["{PROVIDER}"]\n'
        f"  }}\n"
        f"  direct {{\n"
        f'    exclude = ["{PROVIDER}"]\n'
        f"  }}\n"
        f"}}\n"
    )


def write_cli_config(state_dir: Path) -> Path:
    """Write `<state_dir>/terraform.rc` and return its path (for TF_CLI_CONFIG_FILE)."""
    make_folder(state_dir)
    path = state_dir / "terraform.rc"
    path.write_text(render_cli_config(find_provider_mirror()))
    return path
