"""DCP + HiCache + DSPARK for sglang: patch series, runtime plugin and launch preflight."""

from __future__ import annotations

__version__ = "0.1.0"
