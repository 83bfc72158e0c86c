"""The public names of `attnflow.diffeqformer`, for editors and type checkers; at run time
`lazy_loader` reads this stub and imports each name's module on first use."""

from ._command import (
    main as main,
)
from ._data import Corpus as Corpus
from ._data import load_corpus as load_corpus
from ._data import reference_text as reference_text
from ._model import (
    Adapter as Adapter,
)
from ._model import (
    DiffEqFormer as DiffEqFormer,
)
from ._model import (
    DiffEqFormerConfig as DiffEqFormerConfig,
)
from ._model import (
    LoRA as LoRA,
)
from ._model import (
    ScaledColumns as ScaledColumns,
)
from ._model import (
    ShiftedBias as ShiftedBias,
)
from ._model import (
    Sinusoidal as Sinusoidal,
)
from ._model import (
    TimeWeight as TimeWeight,
)
from ._model import (
    checkpoint_logits as checkpoint_logits,
)
from ._model import (
    gpt as gpt,
)
from ._model import (
    lora as lora,
)
from ._model import (
    populate as populate,
)
from ._settings import CORPORA as CORPORA
from ._settings import (
    TrainConfig as TrainConfig,
)
from ._settings import (
    train_config as train_config,
)
from ._store import (
    diffeqformer_config as diffeqformer_config,
)
from ._store import (
    load_diffeqformer as load_diffeqformer,
)
from ._store import (
    save_diffeqformer as save_diffeqformer,
)
from ._store import (
    save_model as save_model,
)
from ._train import (
    TrainResult as TrainResult,
)
from ._train import (
    train as train,
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
