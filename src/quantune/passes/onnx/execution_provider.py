"""Where a candidate runs: the execution provider, as a step of every flow (``target.providers``).

The fastest answer may be the same model on another provider, so the provider is searched like
any parameter. The output is the input model with the provider and its options written beside
it in ``<model>.session.json``: every evaluation opens the candidate there, the cache hashes the
settings with the model, and ``best/`` delivers them. It ends its flows (later passes would read
the model without its settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from quantune.evaluate.session_file import read_session_settings, write_session_settings
from quantune.passes.base import Pass, PassConfig, PassContext
from quantune.passes.onnx.session_tuning import copy_model
from quantune.passes.registry import register_pass

STEP_ID = "provider"  # the step id the engine gives this pass when it adds the provider axis


class ExecutionProviderConfig(PassConfig):
    provider: str = Field(default="CPUExecutionProvider", description="The onnxruntime execution provider.")
    options_by_provider: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="Options per provider (target.provider_options for target.provider)."
    )
    reference: str = Field(
        default="CPUExecutionProvider",
        description="target.provider, where the original runs: a model for it carries no provider setting.",
    )


@register_pass
class ExecutionProvider(Pass):
    """Runs its input model on another execution provider (the model itself is unchanged)."""

    name = "execution_provider"
    role = "provider"
    Config = ExecutionProviderConfig
    search_space = {}
    last_in_flow = True

    def run(self, config: ExecutionProviderConfig, model_in: Path, model_out: Path, context: PassContext) -> None:
        copy_model(model_in, model_out)
        settings: dict[str, Any] = dict(read_session_settings(model_in) or {})
        if config.provider != config.reference:  # else it runs where the original does, as without this step
            settings["provider"] = config.provider
            options = config.options_by_provider.get(config.provider)
            if options:
                settings["provider_options"] = dict(options)
        if settings:
            write_session_settings(model_out, settings)
