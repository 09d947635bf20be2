"""The warm-start recipe: builds the embedded default model that ``slca.models.load_default()`` loads.

toolworld demonstrations (:mod:`.demos`, synthetic entities :mod:`.augment`, copy
drills :mod:`.drills`) -> byte-level BPE tokenizer (:mod:`.tokenizer`) -> a random
``Qwen2ForCausalLM`` -> SFT warm start (:mod:`.sft`) -> ``save_pretrained``
(:mod:`.build`), all fixed by one :class:`BuildConfig` (:mod:`.config`). Not part
of the installed ``slca`` package: run it from a source checkout with
``slca build-model`` (docs/warmstart.md).
"""

from .build import (
    STATE_FILE,
    BuildReport,
    TokenizerRoundTripError,
    build_default,
    build_demonstrations,
    check_tokenizer_round_trip,
    data_digest,
    demonstrations_digest,
    fingerprint,
    make_model,
    prepare_build,
    read_build_state,
    warm_start,
)
from .config import RECIPE_VERSION, WARM_START, BuildConfig, DemoMix, ModelSize
from .demos import Demonstration, make_demonstrations, render_texts
from .sft import SFTConfig, SFTStats, encode_examples, sft_train
from .tokenizer import train_tokenizer

__all__ = [
    "RECIPE_VERSION",
    "STATE_FILE",
    "WARM_START",
    "BuildConfig",
    "BuildReport",
    "DemoMix",
    "Demonstration",
    "ModelSize",
    "SFTConfig",
    "SFTStats",
    "TokenizerRoundTripError",
    "build_default",
    "build_demonstrations",
    "check_tokenizer_round_trip",
    "data_digest",
    "demonstrations_digest",
    "encode_examples",
    "fingerprint",
    "make_demonstrations",
    "make_model",
    "prepare_build",
    "read_build_state",
    "render_texts",
    "sft_train",
    "train_tokenizer",
    "warm_start",
]
