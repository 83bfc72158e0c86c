"""Analyses of a flow, built on the core's fields and step maps.

- `spectrum`: the Lyapunov spectrum of the step map of a simulated field
  (`lyapunov_spectrum`, `rotation_orbit`);
- `pair_exponents`: the finite-time exponents of one token's velocity with respect to
  another's (`token_sensitivity`, "Neural ODE Transformers", eq. 7);
- `plateaus`: metastable plateaus and merges of a cluster-count trajectory
  (`detect_metastability`);
- `equiangular`: the closed-form equiangular reduction behind the phase diagram;
- `surrogate`: the flow-matching surrogate of an attention flow;
- `meanfield`: the continuity equation of the token density on the circle, solved
  spectrally (`meanfield_circle`), its linear growth rates (`circle_growth_rate`), the
  order parameter of its stationary density under noise (`circle_stationary_order`) and the
  Wasserstein-1 distance on the circle (`circle_wasserstein`).

Each is reached as `attnflow.NAME` too (`attnflow.lyapunov_spectrum`).
"""
