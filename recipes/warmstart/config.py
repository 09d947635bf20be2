"""Build configuration of the embedded default model (flat dataclasses).

:class:`BuildConfig` fixes everything that determines the built model: the
demonstration data and its quality mix, the tokenizer, the architecture and the
warm-start optimisation. With :data:`RECIPE_VERSION` and the data it generates it
makes the build's fingerprint (:func:`~.build.fingerprint`), so a changed config
builds a new model instead of loading a stale one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .augment import ENTITY_STYLES
from .sft import SFTConfig

__all__ = ["ModelSize", "DemoMix", "BuildConfig", "RECIPE_VERSION", "WARM_START", "LATER_FIELDS"]

#: Bump when the build code (tokenizer training, model initialisation, SFT) changes what a given
#: config produces from the same data; a change to the generated data changes the fingerprint by itself.
RECIPE_VERSION = 1

#: The default build's warm start (issue 13, run J in docs/warmstart.md): 4,000 steps of
#: 2,048 tokens at lr 1.5e-3, an induction warm-up of 150 steps and one induction batch
#: every 2 steps, a language-modelling loss of weight 0.5 on tool responses and weight 4
#: on the assistant tokens copied from the request. About 40 CPU minutes: the result
#: ships with the package (``src/slca/models/shipped``, rebuilt by ``slca build-model``).
WARM_START = SFTConfig(steps=4000, batch_tokens=2048, lr=1.5e-3, induction_steps=150, induction_every=2,
                       env_loss_weight=0.5, copy_weight=4.0)


#: Fields added after the first shipped fingerprints, with the value that reproduces the data from
#: before them: the fingerprint leaves a field out at that value, so adding an option (off) does not
#: rename the builds made without it (dotted names are fields of the nested configs).
LATER_FIELDS = {"entity_style": "syllables", "paraphrase": 0.0, "mix.wrong_entity": 0.0}


@dataclass(frozen=True)
class ModelSize:
    """Qwen2 architecture of the default model (see docs/warmstart.md for the measurements)."""

    hidden_size: int = 192
    """Width of the residual stream."""
    num_hidden_layers: int = 4
    """Decoder layers."""
    num_attention_heads: int = 6
    """Query heads (head dim = hidden_size / heads)."""
    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention, as Qwen2)."""
    intermediate_size: int = 512
    """SwiGLU hidden width."""
    max_position_embeddings: int = 1024
    """Context length (prompts + responses are kept under ~512 tokens)."""
    rope_theta: float = 10000.0
    """RoPE base."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"ModelSize.hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ModelSize.num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )


@dataclass(frozen=True)
class DemoMix:
    """Quality mix of the warm-start demonstrations (probabilities, independent per demo).

    Each flaw hits one segment, so the warm-started policy is imperfect on both
    and RL has something to fix in each (the paper's diagnostic case is
    ``sequential`` + a good summary vs. a parallel turn + a poor summary).
    """

    sequential: float = 0.42
    """Parallel gold step made as one call per turn (execution: inefficient). 0.35 before build PF3 (issue 27): with
    real-looking names the better model left the split flaw in 12% of parallel tasks at 0.35."""
    redundant: float = 0.15
    """One call repeated in an extra turn (execution: redundant)."""
    wrong_argument: float = 0.1
    """One argument value replaced by another entity's (execution: wrong args)."""
    unfaithful: float = 0.15
    """A value in the summary differs from the tool result (summary: unfaithful)."""
    wrong_entity: float = 0.1
    """The summary names another entity than the request's (``In Sofia`` for Tokyo; summary: unfaithful)."""
    incomplete: float = 0.15
    """The summary leaves out part of the answer (summary: incomplete)."""
    verbose: float = 0.15
    """The summary is padded with filler (summary: not concise)."""

    def __post_init__(self) -> None:
        for name, p in asdict(self).items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"DemoMix.{name} must be a probability in [0, 1], got {p}")


@dataclass(frozen=True)
class BuildConfig:
    """Everything that determines the built default model."""

    n_tasks: int = 12000
    """Toolworld train-split tasks turned into demonstrations."""
    data_seed: int = 0
    """Seeds task generation, the simulator and the demo flaws."""
    synthetic_entities: float = 0.8
    """Fraction of demos whose cities, tickers, people, titles, dates and request numbers are
    replaced by fresh pseudo-words (teaches copying; see :mod:`.augment`)."""
    entity_style: str = "faker"
    """How synthetic names are drawn (:data:`.augment.ENTITY_STYLES`): ``faker`` (the default since build PF3,
    issue 27: real-world names of many locales from faker's lists, test-entity words removed, one in four a
    pseudo-word; needs the ``warmstart`` extra), ``syllables`` (consonant-vowel pseudo-words) or ``varied``
    (a wider syllable grammar, one name in four of random letters)."""
    paraphrase: float = 0.5
    """Fraction of demos whose request is rephrased by the procedural grammar of :mod:`.paraphrase`
    (lead-ins, synonyms, register; never a test template)."""
    drills: int = 0
    """Copy drills mixed into the warm-start data (:mod:`.drills`): short
    conversations whose assistant tokens are all copied from the request."""
    vocab_size: int = 1024
    """BPE vocabulary, special tokens included."""
    digit_runs: bool = False
    """Tokenizer: keep runs of digits whole before BPE (frequent numbers become one token)
    instead of Qwen2's one digit per token (:func:`.tokenizer.train_tokenizer`).
    The build refuses it under transformers 5: ``AutoTokenizer`` loads a Qwen2 folder with
    Qwen2's own digit split (:func:`.build.check_tokenizer_round_trip`)."""
    model: ModelSize = field(default_factory=ModelSize)
    """Architecture."""
    mix: DemoMix = field(default_factory=DemoMix)
    """Demonstration quality mix."""
    sft: SFTConfig = field(default_factory=lambda: WARM_START)
    """Warm-start optimisation (:data:`WARM_START`; ``SFTConfig()`` is the plain recipe of the first build)."""
    model_seed: int = 0
    """Seeds the weight initialisation."""

    def __post_init__(self) -> None:
        if self.entity_style not in ENTITY_STYLES:
            raise ValueError(f"BuildConfig.entity_style must be one of {ENTITY_STYLES}, got {self.entity_style!r}")
        for name in ("synthetic_entities", "paraphrase"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"BuildConfig.{name} must be a probability in [0, 1], got {p}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "BuildConfig":
        d = dict(d)
        return cls(
            model=ModelSize(**d.pop("model", {})),
            mix=DemoMix(**d.pop("mix", {})),
            sft=SFTConfig(**d.pop("sft", {})),
            **d,
        )
