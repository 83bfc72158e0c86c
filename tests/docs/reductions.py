"""The reduced sizes the documentation's examples run at in the tests (test_examples.py),
kept here so that the pages show the reader's commands alone.

`COMMANDS[PAGE][COMMAND]` gives the overrides an `attnflow` command of a shell block of
PAGE runs with: each `KEY=VALUE` replaces the command's argument with the same key (its
`+`/`++` prefix kept) or is added at the end (`markdown_blocks.apply_overrides`).
COMMAND is the command line as the page writes it, without its `# ...` comment, spaces
collapsed and continuation lines joined (`markdown_blocks.Command.key`). Every
`attnflow` command of a block that runs has its entry, `AS_WRITTEN` for one that runs at
the page's size, except those that run nothing (`plot`, `report`, `help`, `--help`,
`--version`, `--cfg`: `markdown_blocks.runs_something`). A command edited on its page no
longer matches its entry: the test then names both, so that the reduction is looked at
again rather than the command run at its full size.

`PYTHON_LINES[PAGE][LINE]` replaces a line of a Python block (LINE: the line without its
comment, stripped) by the code the test runs, its indentation kept.

test_examples.py fails on a command with no entry and on an entry that matches nothing on
its page (a stale one).
"""

# ruff: noqa: E501 (an entry is keyed by the command as the page writes it, on one line)
from __future__ import annotations

AS_WRITTEN = ""  # the command runs at the page's size

# `attnflow train` at a tiny size (docs/diffeqformer.md)
TRAIN_TINY = (
    "corpus=induction vocab=8 dim=16 heads=2 hidden=32 context=16 d_emb=8 frequencies=4 steps=4 batch=8 "
    "train_steps=4 eval_every=2 eval_batches=1"
)
# experiment=diffeqformer training both models at a tiny size in runs/tiny
DIFFEQFORMER_TINY = (
    "experiment.options.out=runs/tiny +experiment.options.train.corpus=induction +experiment.options.train.vocab=8 "
    "+experiment.options.train.dim=16 +experiment.options.train.heads=2 +experiment.options.train.hidden=32 "
    "+experiment.options.train.context=16 +experiment.options.train.d_emb=8 +experiment.options.train.frequencies=4 "
    "+experiment.options.train.steps=4 +experiment.options.train.batch=8 +experiment.options.train.train_steps=20 "
    "+experiment.options.train.eval_every=10 +experiment.options.train.eval_batches=1 experiment.options.tokens=64 "
    'experiment.options.spectra_steps=4 experiment.options.cluster_horizon=2 experiment.options.sentence="s1 s5 s2 s7"'
)
# experiment=adaptive_depth on the tiny models of runs/tiny (DIFFEQFORMER_TINY's)
ADAPTIVE_DEPTH_TINY = (
    "experiment.options.pretrained=runs/tiny/diffeqformer experiment.options.baseline=runs/tiny/gpt "
    "+experiment.options.pretrain.corpus=induction +experiment.options.pretrain.vocab=8 "
    "+experiment.options.pretrain.dim=16 +experiment.options.pretrain.heads=2 +experiment.options.pretrain.hidden=32 "
    "+experiment.options.pretrain.context=16 +experiment.options.pretrain.d_emb=8 "
    "+experiment.options.pretrain.frequencies=4 +experiment.options.pretrain.steps=4 "
    "+experiment.options.pretrain.batch=8 +experiment.options.pretrain.train_steps=20 "
    "+experiment.options.pretrain.eval_every=10 +experiment.options.pretrain.eval_batches=1 "
    "experiment.options.corpus=induction experiment.options.finetune_steps=2 +experiment.options.train.batch=8 "
    "+experiment.options.train.eval_every=1 +experiment.options.train.eval_batches=1"
)
MEANFIELD_SMALL = (
    "experiment.options.n=[50,200] experiment.options.members=2 experiment.options.times=[0.0,1.0] "
    "experiment.options.grid=192"
)
# the small checkpoint (all-MiniLM-L6-v2) the tests have, in place of SmolLM2
MINILM = 'checkpoint=minilm text="The cat sat."'

COMMANDS: dict[str, dict[str, str]] = {
    "docs/checkpoints.md": {
        "attnflow experiment=checkpoint": MINILM + " experiment.options.steps=[1,2] experiment.options.probes=false",
        'attnflow experiment=checkpoint checkpoint=minilm text="The cat sat on the mat."': "experiment.options.steps=[1,2] experiment.options.probes=false",
    },
    "docs/cli.md": {
        "attnflow n=32 d=3 beta=1.0 members=64 seed=0 t1=30 dt=0.1 attention_kind=sa scheme=sphere causal=false init=uniform solver=euler_renorm": "members=4 t1=3",
        "attnflow beta=[0.5,1,2,4,9] d=2 hydra.run.dir=runs/circle": "members=4 t1=3",
        "attnflow -m beta=0.5,1,2 hydra.sweep.dir=runs/sweep": "members=4 t1=3",
        "attnflow init=caps init.k=3 init.radius=0.2 weights.v.switch_times=[5] weights.v.factors=[1,-1]": "members=4 t1=6",
    },
    "docs/diffeqformer.md": {
        "attnflow train": TRAIN_TINY,
        "attnflow train model=gpt": TRAIN_TINY,
        "attnflow train corpus=induction vocab=16 train_steps=300": TRAIN_TINY,
        "attnflow train out=runs/train/dfq": TRAIN_TINY,
        "attnflow train -m lr=1e-3,3e-3 out=runs/train/lr": TRAIN_TINY,
        "attnflow train init=runs/train/diffeqformer-reference-a-s18-seed0 steps=12 corpus=reference-b train_steps=500": "init=runs/train/diffeqformer-induction-s4-seed0 steps=2 corpus=induction train_steps=2 eval_every=1 eval_batches=1",
        "attnflow train init=runs/train/diffeqformer-reference-a-s18-seed0 steps=12 corpus=reference-b lora_rank=4 train_steps=500": "init=runs/train/diffeqformer-induction-s4-seed0 steps=2 corpus=induction train_steps=2 eval_every=1 eval_batches=1",
        "attnflow train model=gpt init=runs/train/gpt-reference-a-s18-seed0 corpus=reference-b lora_rank=4 train_steps=500": "init=runs/train/gpt-induction-s4-seed0 steps=4 corpus=induction train_steps=2 eval_every=1 eval_batches=1",
    },
    "docs/extending.md": {
        "PYTHONPATH=. attnflow n=8 d=3 members=4 t1=2 dt=0.01 solver=rk4 dtype=float64 beta=1 attention=false save_states=true +terms.rot._target_=mystudy.Rotation '+terms.rot.generator=[[0,-1,0],[1,0,0],[0,0,0]]' +terms.rot.speed=0.5 hydra.run.dir=runs/rotation": AS_WRITTEN,
        "PYTHONPATH=. attnflow n=8 d=3 members=4 t1=2 beta=1 save_states=true 'metrics=[energy,mystudy.spread]' hydra.run.dir=runs/spread": AS_WRITTEN,
        "PYTHONPATH=. attnflow -m n=8 d=3 members=4 t1=2 beta=1 attention=false +terms.rot._target_=mystudy.Rotation '+terms.rot.generator=[[0,-1,0],[1,0,0],[0,0,0]]' +terms.rot.speed=0.5,1.0 'metrics=[order_parameter,mystudy.spread]' hydra.sweep.dir=sweeps/rotation": AS_WRITTEN,
        "PYTHONPATH=. attnflow --config-dir cfg experiment=crossing hydra.run.dir=runs/crossing": AS_WRITTEN,
        "PYTHONPATH=. attnflow -m --config-dir cfg experiment=crossing experiment.options.threshold=0.5,0.8 hydra.sweep.dir=sweeps/crossing": AS_WRITTEN,
        "attnflow n=16 d=3 members=4 t1=4 beta=1 +terms.pull._target_=external_field '+terms.pull.direction=[0,0,1]' +terms.pull.strength=0.5 hydra.run.dir=runs/pull": AS_WRITTEN,
    },
    "docs/gallery/adaptive_depth.md": {
        "attnflow experiment=adaptive_depth hydra.run.dir=figures/adaptive_depth": ADAPTIVE_DEPTH_TINY
        + " experiment.options.steps=[2,4] experiment.options.methods=[full]",
        "attnflow experiment=adaptive_depth experiment.options.methods=[] 'experiment.options.steps=[4,6,9,12,18,24,36]'": ADAPTIVE_DEPTH_TINY
        + " experiment.options.steps=[2,4]",
        "attnflow experiment=adaptive_depth experiment.options.finetune_steps=500 +experiment.options.train.lr=0.001": ADAPTIVE_DEPTH_TINY
        + " experiment.options.steps=[2] experiment.options.methods=[full]",
    },
    "docs/gallery/bouncing.md": {
        "attnflow experiment=bouncing": "members=8",
    },
    "docs/gallery/causal.md": {
        "attnflow experiment=causal": "members=8 n=6",
    },
    "docs/gallery/checkpoint.md": {
        "attnflow experiment=checkpoint": MINILM + " experiment.options.steps=[1,2] experiment.options.probes=false",
    },
    "docs/gallery/circle.md": {
        "attnflow experiment=circle": "members=4",
    },
    "docs/gallery/cross_attention.md": {
        "attnflow experiment=cross_attention": "members=4 beta=[0.1,31.6] experiment.options.cross_betas=[1.0,100.0] experiment.options.cases=[[0.1,100.0]]",
    },
    "docs/gallery/diffeqformer.md": {
        "attnflow experiment=diffeqformer hydra.run.dir=figures/diffeqformer": DIFFEQFORMER_TINY,
        "attnflow experiment=diffeqformer experiment.options.out=runs/other": DIFFEQFORMER_TINY,
        "attnflow experiment=diffeqformer +experiment.options.train.train_steps=3000 experiment.options.out=runs/long": DIFFEQFORMER_TINY,
        'attnflow experiment=diffeqformer experiment.options.sentence="The import statement defines a name in its"': DIFFEQFORMER_TINY,
    },
    "docs/gallery/flow_matching.md": {
        "attnflow experiment=flow_matching": "members=64 experiment.options.train_steps=200 experiment.options.distance_times=5",
    },
    "docs/gallery/hardmax_sinkhorn.md": {
        "attnflow experiment=hardmax_sinkhorn": "members=2 n=8 t1=2.0 experiment.options.polygons=1",
    },
    "docs/gallery/long_context.md": {
        "attnflow experiment=long_context": "experiment.options.n_max=1000 experiment.options.n_count=2",
    },
    "docs/gallery/lyapunov.md": {
        "attnflow experiment=lyapunov": "beta=[1,3] members=2 t1=10",
    },
    "docs/gallery/lyapunov_polynomial.md": {
        "attnflow experiment=lyapunov_polynomial": "n=4 members=2 t1=5",
    },
    "docs/gallery/many_heads.md": {
        "attnflow experiment=many_heads": "members=8 experiment.options.heads=[1,64]",
    },
    "docs/gallery/meanfield_circle.md": {
        "attnflow experiment=meanfield_circle": MEANFIELD_SMALL,
        "attnflow experiment=meanfield_circle experiment.options.sigma=1.0 experiment.options.mode=1 experiment.options.dt=0.0625 experiment.options.times=[0.0,1.0,2.0,3.0]": MEANFIELD_SMALL,
    },
    "docs/gallery/metastability.md": {
        "attnflow experiment=metastability": "members=2",
    },
    "docs/gallery/noise_transition.md": {
        "attnflow experiment=noise_transition": "experiment.options.sizes=[16] experiment.options.members=null experiment.options.ratios=[0.6,1.25,1.5] members=2 t1=10.0 dt=0.078125 saves=11",
    },
    "docs/gallery/normalization.md": {
        "attnflow experiment=normalization": "d=16 beta=4 n=12 members=2",
    },
    "docs/gallery/phase_diagram.md": {
        "attnflow experiment=phase_diagram": "d=[2,8] members=8 beta=[1,4] t1=3",
    },
    "docs/gallery/phase_diagram_random.md": {
        "attnflow experiment=phase_diagram_random": "members=4 beta=[0.3,9] t1=3",
    },
    "docs/gallery/polynomial.md": {
        "attnflow experiment=polynomial": "members=4",
    },
    "docs/gallery/polytope.md": {
        "attnflow experiment=polytope": "members=8",
    },
    "docs/gallery/random_qk.md": {
        "attnflow experiment=random_qk": "members=6 t1=12 saves=13",
    },
    "docs/gallery/sensitivity.md": {
        "attnflow experiment=sensitivity": MINILM,
        "attnflow experiment=sensitivity experiment.options.outputs=null": MINILM,
        "attnflow experiment=sensitivity experiment.options.steps=4": MINILM + " experiment.options.steps=2",
    },
    "docs/gallery/single_cluster.md": {
        "attnflow experiment=single_cluster": "members=2 t1=1 saves=3",
    },
    "docs/gallery/token_detection.md": {
        "attnflow experiment=token_detection": "dt=0.05 saves=41",
    },
    "docs/getting-started.md": {
        "attnflow": "members=8 t1=3",
        "attnflow n=16 d=3 beta=[1,4] members=64 hydra.run.dir=runs/first": "members=4 t1=3",
    },
    "docs/long-sequences.md": {
        "attnflow n=100000 d=3 members=1 beta=1 t1=1 dt=0.1 saves=2 metrics=[log_energy,pair_density,order_parameter]": "n=3000 t1=0.2",
        "attnflow n=4096 attention_block=256 members=4 beta=1 t1=1 saves=2": "n=1100 t1=0.2",
        "attnflow n=2000 attention_block=0 members=4 beta=1 t1=1 saves=2": "n=200 t1=0.2",
        "attnflow n=1000000 d=2 summation=harmonic members=1 beta=4 t1=2 dt=0.1 saves=3 metrics=[log_energy,pair_density,clusters,order_parameter]": "n=4096 t1=0.2",
        "attnflow n=4096 d=3 summation=auto members=4 beta=4 t1=2 metrics=[log_energy,order_parameter]": "members=2 t1=0.2",
    },
    "docs/model.md": {
        "attnflow cross.enabled=true cross.init.kind=caps cross.init.k=3 cross.beta=8 save_states=true metrics=[clusters,source_capture,nearest_source]": "members=2 t1=2",
    },
    "docs/tutorial.md": {
        "attnflow n=32 d=3 beta=[1,4] members=64 t1=30 hydra.run.dir=runs/one": "members=4 t1=3",
        "attnflow -m d=2,3,8 solver=euler_renorm,rk4 beta=[1,4] hydra.sweep.dir=sweeps/d": "members=4 t1=3",
        "attnflow experiment=metastability members=4 hydra.run.dir=runs/metastability": "members=2",
    },
}
PYTHON_LINES: dict[str, dict[str, str]] = {
    "docs/api/index.md": {
        'ds = af.run({"n": 32, "d": 3, "beta": [1.0, 4.0], "members": 64, "t1": 30.0})': 'ds = af.run({"n": 32, "d": 3, "beta": [1.0, 4.0], "members": 8, "t1": 30.0})',
    },
    "docs/diffeqformer.md": {
        'result = train(train_config(["corpus=induction", "vocab=16", "train_steps=200", "out=runs/python"]))': 'result = train(train_config(["corpus=induction", "vocab=8", "dim=16", "heads=2", "hidden=32", "context=16", "d_emb=8", "frequencies=4", "steps=4", "batch=8", "train_steps=4", "eval_every=2", "eval_batches=1", "out=runs/python"]))',
    },
    "docs/tutorial.md": {
        'ds = af.run({"n": 32, "d": 3, "beta": [1.0, 4.0], "members": 64, "t1": 30.0})': 'ds = af.run({"n": 32, "d": 3, "beta": [1.0, 4.0], "members": 4, "t1": 3.0})',
        'ds = run_experiment("metastability", {"members": 4})': 'ds = run_experiment("metastability", {"members": 2})',
    },
}
