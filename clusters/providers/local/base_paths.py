"""Where the local provider's helper programs live."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "launcher.py"
PREFLIGHT_CHECK = HERE.parent / "preflight_check.py"
