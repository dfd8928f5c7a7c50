"""Device stage (torch): the compiler's rules for timm's ops (``timm.data.create_transform``'s pipelines)."""

from __future__ import annotations

from fastload.torch.compile_plan import Rule

__all__ = ["TIMM_RULES"]

TIMM_RULES: tuple[Rule, ...] = ()
