"""Tool environment: simulators, the built-in ``toolworld`` suite and dataset loaders."""

from slca.env.llm import LLMSimulator
from slca.env.loaders import load_tasks, save_tasks
from slca.env.schema import ToolBox, as_tool_specs, check_tool_schema
from slca.env.sft import load_sft_examples, sft_dataset
from slca.env.simulators import BaseSimulator, PythonSimulator, SchemaSimulator, Simulator, ToolError

__all__ = [
    "BaseSimulator",
    "LLMSimulator",
    "PythonSimulator",
    "SchemaSimulator",
    "Simulator",
    "ToolBox",
    "ToolError",
    "as_tool_specs",
    "load_sft_examples",
    "load_tasks",
    "save_tasks",
    "sft_dataset",
    "check_tool_schema",
]
