"""``python -m opruntime.testing --device acme:0 [--plugin acme] [pytest options]``: run the
conformance suite with pytest."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    import pytest

    args = list(sys.argv[1:] if argv is None else argv)
    for flag in ("--device", "--plugin", "--configs", "--cases"):  # short spellings of the plugin's options
        args = [a.replace(flag, "--opruntime-" + flag[2:], 1) if a.startswith(flag) else a for a in args]
    return int(pytest.main(["-p", "opruntime.testing.plugin", "--pyargs", "opruntime.testing", *args]))


if __name__ == "__main__":
    sys.exit(main())
