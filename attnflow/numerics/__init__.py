"""The dynamics, in JAX: geometries, schedules, the terms of the field and the field
itself, initial laws, random matrices, noise, metrics, tiled attention, the solvers and
`simulate`, the time grid; and `_numerics`, what a component's `build` assembles from
(handed to it as `lib`). It imports only the schema."""
