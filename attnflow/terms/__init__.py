"""The terms of the vector field that attnflow ships beyond attention and the MLP, one
file each, named on the command line by their short name (`attnflow.schema._plugins.BUILTIN_TERMS`):
`+terms.NAME._target_=external_field`. Each is written as a researcher's own term is
(docs/extending.md): a subclass of `attnflow.AbstractInteraction` whose fields are its
settings."""
