"""The public names of `attnflow.diffeqformer`, for editors and type checkers; at run time
`lazy_loader` reads this stub and imports each name's module on first use."""

from ._data import CORPORA as CORPORA, Corpus as Corpus, load_corpus as load_corpus, reference_text as reference_text
from ._model import (
    Adapter as Adapter,
    checkpoint_logits as checkpoint_logits,
    DiffEqFormer as DiffEqFormer,
    DiffEqFormerConfig as DiffEqFormerConfig,
    gpt as gpt,
    LoRA as LoRA,
    lora as lora,
    populate as populate,
    ScaledColumns as ScaledColumns,
    ShiftedBias as ShiftedBias,
    Sinusoidal as Sinusoidal,
    TimeWeight as TimeWeight,
)
from ._store import (
    diffeqformer_config as diffeqformer_config,
    load_diffeqformer as load_diffeqformer,
    save_diffeqformer as save_diffeqformer,
    save_model as save_model,
)
from ._train import (
    main as main,
    train as train,
    train_config as train_config,
    TrainConfig as TrainConfig,
    TrainResult as TrainResult,
)

__all__ = [
    "Adapter",
    "CORPORA",
    "Corpus",
    "DiffEqFormer",
    "DiffEqFormerConfig",
    "LoRA",
    "ScaledColumns",
    "ShiftedBias",
    "Sinusoidal",
    "TimeWeight",
    "TrainConfig",
    "TrainResult",
    "checkpoint_logits",
    "diffeqformer_config",
    "gpt",
    "load_corpus",
    "load_diffeqformer",
    "lora",
    "main",
    "populate",
    "reference_text",
    "save_diffeqformer",
    "save_model",
    "train",
    "train_config",
]
