"""The settings and their checks, without JAX: the typed schema of a study (`_config`),
its checks (`_checks`), errors (`_errors`) and words (`_words`), the solvers' table
(`_methods`), the metric registry (`_metric_registry`), the loader of code a config
names by its import path (`_plugins`), and the components a config names by a kind, one
file each: `initial/`, `system/`, `weights/`. The bottom layer: it imports no other
folder of attnflow."""
