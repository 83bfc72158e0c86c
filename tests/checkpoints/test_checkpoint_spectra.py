"""Spectra of the per-head virtual matrices W_QK = Q^T K, W_OV = O V and the geometric
probes of "Traveling Words", on tiny checkpoints built directly in canonical form.

Every assertion is an identity with an independent route: full d x d numpy
eigenvalues/SVD against the low-rank factor route, planted token directions, the logit
lens against `Checkpoint.logits`, Table-1 distances of an embedding already on the sphere."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnflow.numerics._terms import TokenNorm
from attnflow.checkpoints._canonical import (
    Attention,
    Blocks,
    Checkpoint,
    FeedForward,
    stack_layers,
)
from attnflow.checkpoints.probes import (
    decode_head_vectors,
    distance_table,
    draw_token_path,
    embedding_distances,
    head_table,
    logit_lens,
    normalized_embeddings,
    token_path,
    write_head_tables,
)
from attnflow.checkpoints.spectra import draw_spectra, head_spectra, low_rank_spectrum

L, H, DK, D, VOCAB, HIDDEN = 2, 3, 8, 32, 120, 48


def _norm(rng, kind, eps=1e-6, unit=False):
    gamma = jnp.ones(D) if unit else jnp.asarray(1 + 0.1 * rng.normal(size=D))
    shift = jnp.asarray(0.1 * rng.normal(size=D)) if kind == "layer" and not unit else None
    return TokenNorm(kind, gamma, shift, 0.0 if unit else eps)


def _norms(rng, kind, unit=False):
    """One normalization per layer, stacked (gains (L, d)) as the loaders do."""
    return stack_layers([_norm(rng, kind, unit=unit) for _ in range(L)])


def _checkpoint(seed=0, *, tied_qk=False, kind="rms", family="llama", arrangement="sequential",
                lm_head=True, embed=None, unit_gain=False) -> Checkpoint:
    """A random canonical checkpoint (float64): L layers, H heads of size DK, width D."""
    rng = np.random.default_rng(seed)
    draw = lambda *shape: jnp.asarray(rng.normal(size=shape) / np.sqrt(shape[-1]))
    query = draw(L, H, DK, D)
    attention = Attention(query=query, key=query if tied_qk else draw(L, H, DK, D), value=draw(L, H, DK, D),
                          output=draw(L, H, D, DK), kv_heads=H)
    mlp = FeedForward(w1=draw(L, HIDDEN, D), w2=draw(L, D, HIDDEN), activation="gelu")
    attn_norm, mlp_norm = _norms(rng, kind, unit=unit_gain), _norms(rng, kind)
    final = None if arrangement == "post" else _norm(rng, kind)
    embed_norm = _norm(rng, kind) if arrangement == "post" else None
    return Checkpoint(
        family=family, arrangement=arrangement, causal=arrangement != "post",
        blocks=Blocks(attention=attention, mlp=mlp, attn_norm=attn_norm, mlp_norm=mlp_norm),
        embed=draw(VOCAB, D) if embed is None else jnp.asarray(embed), embed_norm=embed_norm, final_norm=final,
        unembed=draw(VOCAB, D) if lm_head else None, name=f"tiny-{family}",
    )


class Names:
    """A stand-in tokenizer: `tokens(ids)` as attnflow's `Tokenizer` has it."""

    def tokens(self, ids):
        return [f"tok{i}" for i in ids]


def _match(expected, got, atol):
    """Two multisets of complex numbers are equal: every point of each has a partner in
    the other within `atol` (sorting complex values with ties is not a safe route)."""
    distance = np.abs(expected[..., :, None] - got[..., None, :])
    assert distance.min(-1).max() < atol and distance.min(-2).max() < atol


def test_qk_eigenvalues_are_those_of_the_full_matrix_and_the_rest_vanish():
    ck = _checkpoint(1)
    ds = head_spectra(ck)
    q, k = np.asarray(ck.blocks.attention.query), np.asarray(ck.blocks.attention.key)
    full = np.linalg.eigvals(np.swapaxes(q, -1, -2) @ k)  # (L, H, d), d x d route
    order = np.argsort(-np.abs(full), axis=-1)
    full = np.take_along_axis(full, order, -1)
    got = ds["qk_eig_real"].values + 1j * ds["qk_eig_imag"].values
    assert got.shape == (L, H, DK)
    _match(full[..., :DK], got, 1e-9)
    assert np.abs(full[..., DK:]).max() < 1e-9  # rank d_k: the other d - d_k are zero
    np.testing.assert_array_less(np.diff(np.abs(got), axis=-1), 1e-12)  # sorted by modulus
    # The trace is the sum of the eigenvalues; the radius the largest modulus.
    np.testing.assert_allclose(ds["qk_trace"].values, got.sum(-1).real, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got.sum(-1).imag, 0, atol=1e-10)
    np.testing.assert_allclose(ds["qk_radius"].values, np.abs(full[..., 0]), rtol=1e-10)
    ov = np.linalg.eigvals(np.asarray(ck.blocks.attention.output) @ np.asarray(ck.blocks.attention.value))
    _match(np.take_along_axis(ov, np.argsort(-np.abs(ov), -1), -1)[..., :DK],
           ds["ov_eig_real"].values + 1j * ds["ov_eig_imag"].values, 1e-9)


def test_singular_values_and_vectors_of_ov_against_the_product():
    ck = _checkpoint(2)
    ds = head_spectra(ck)
    att = ck.blocks.attention
    product = np.asarray(att.output) @ np.asarray(att.value)  # (L, H, d, d)
    expected = np.linalg.svd(product, compute_uv=False)
    np.testing.assert_allclose(ds["ov_singular"].values, expected[..., :DK], rtol=1e-10)
    assert expected[..., DK:].max() < 1e-10
    np.testing.assert_allclose(ds["ov_frobenius"].values, np.linalg.norm(product, axis=(-2, -1)), rtol=1e-10)
    qk = np.swapaxes(np.asarray(att.query), -1, -2) @ np.asarray(att.key)
    np.testing.assert_allclose(ds["qk_singular"].values, np.linalg.svd(qk, compute_uv=False)[..., :DK], rtol=1e-10)
    # The vectors: orthonormal and sum_k sigma_k a_k b_k^T rebuilds O V.
    spectrum = low_rank_spectrum(att.output, jnp.swapaxes(att.value, -1, -2))
    a, s, b = (np.asarray(x) for x in (spectrum.left, spectrum.singular, spectrum.right))
    np.testing.assert_allclose((a * s[..., None, :]) @ np.swapaxes(b, -1, -2), product, atol=1e-12)
    np.testing.assert_allclose(np.swapaxes(a, -1, -2) @ a, np.broadcast_to(np.eye(DK), (L, H, DK, DK)), atol=1e-12)


def test_tied_query_and_key_give_a_real_nonnegative_spectrum():
    ds = head_spectra(_checkpoint(3, tied_qk=True))
    np.testing.assert_allclose(ds["qk_eig_imag"].values, 0, atol=1e-10)
    assert ds["qk_eig_real"].values.min() > -1e-10
    np.testing.assert_allclose(ds["qk_positive_fraction"].values, 1.0)
    # Q^T Q is symmetric positive semi-definite: eigenvalues equal singular values.
    np.testing.assert_allclose(ds["qk_eig_real"].values, ds["qk_singular"].values, rtol=1e-9)
    # A general OV has some complex pairs, so the test above is not vacuous.
    assert np.abs(ds["ov_eig_imag"].values).max() > 1e-3


def test_spectra_work_in_float32_and_draw(tmp_path):
    ck = jax.tree.map(lambda a: a.astype(jnp.float32) if isinstance(a, jax.Array) else a, _checkpoint(4))
    ds = head_spectra(ck)
    assert ds["qk_eig_real"].dtype == np.float32
    exact = head_spectra(_checkpoint(4))
    np.testing.assert_allclose(ds["ov_singular"].values, exact["ov_singular"].values, rtol=1e-4, atol=1e-5)
    figures = draw_spectra(ds, tmp_path, "tiny")
    assert sorted(figures) == ["tiny", "tiny_summary"]
    paths = sorted(tmp_path.glob("tiny*"))
    assert [p.name for p in paths] == ["tiny.pdf", "tiny.png", "tiny_summary.pdf", "tiny_summary.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_planted_token_directions_are_decoded_first(tmp_path):
    layer, head = 1, 2
    base = _checkpoint(5, unit_gain=True)
    att = base.blocks.attention
    qk = np.swapaxes(np.asarray(att.query[layer, head]), 0, 1) @ np.asarray(att.key[layer, head])
    ov = np.asarray(att.output[layer, head]) @ np.asarray(att.value[layer, head])
    u_qk, _, vt_qk = np.linalg.svd(qk)
    u_ov, _, vt_ov = np.linalg.svd(ov)
    rng = np.random.default_rng(6)
    embed = 0.3 * rng.normal(size=(VOCAB, D)) / np.sqrt(D)
    unembed = 0.3 * rng.normal(size=(VOCAB, D)) / np.sqrt(D)
    embed[7], embed[9], embed[13] = 2 * u_qk[:, 0], 3 * vt_qk[0], -2 * vt_ov[0]  # query, key, OV input
    unembed[11] = -5 * u_ov[:, 0]  # OV output, planted with the opposite sign
    ck = Checkpoint(family="llama", arrangement="sequential", causal=True, blocks=base.blocks,
                    embed=jnp.asarray(embed), final_norm=base.final_norm, unembed=jnp.asarray(unembed), name="planted")
    ds = decode_head_vectors(ck, Names(), k=3, top=4, layers=[-1])  # the last block, as layer 1
    assert list(ds["layer"].values) == [layer]
    first = ds.sel(layer=layer, head=head, component=0, top=0)
    assert int(first["token_id"].sel(vector="qk_query")) == 7
    assert int(first["token_id"].sel(vector="qk_key")) == 9
    assert int(first["token_id"].sel(vector="ov_output")) == 11
    assert int(first["token_id"].sel(vector="ov_input")) == 13
    assert str(first["token"].sel(vector="qk_query").values) == "tok7"
    # The planted query token is a unit-cosine match on the sphere of radius sqrt(d).
    np.testing.assert_allclose(float(first["score"].sel(vector="qk_query")), np.sqrt(D), rtol=1e-6)
    assert (np.diff(ds["score"].values, axis=-1) <= 1e-12).all()
    assert ds["token_id"].shape == (4, 1, H, 3, 4)
    table = head_table(ds, layer, head)
    assert "'tok7'" in table and table.count("\n") == 3 + 3
    md, csv = write_head_tables(ds, tmp_path)
    assert csv.read_text().count("\n") == 1 + 4 * H * 3 * 4
    assert md.read_text().count("#### layer") == H


def test_normalized_embeddings_follow_the_norm_each_block_reads():
    ck = _checkpoint(7, kind="layer", family="bert", arrangement="post", lm_head=False)
    e = ck.embed
    np.testing.assert_allclose(normalized_embeddings(ck, at=0), ck.embed_norm(e), rtol=1e-12)
    mlp_norm0 = jax.tree.map(lambda a: a[0], ck.blocks.mlp_norm)
    np.testing.assert_allclose(normalized_embeddings(ck, at=1), mlp_norm0(e), rtol=1e-12)
    # Bare map: rows centred over their coordinates, on the sphere of radius sqrt(d).
    bare = np.asarray(normalized_embeddings(ck, gain=False))
    np.testing.assert_allclose(bare.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(bare, axis=-1), np.sqrt(D), rtol=1e-12)
    pre = _checkpoint(7, kind="rms")
    attn1 = jax.tree.map(lambda a: a[1], pre.blocks.attn_norm)
    np.testing.assert_allclose(normalized_embeddings(pre, at=1), attn1(pre.embed), rtol=1e-12)
    np.testing.assert_allclose(normalized_embeddings(pre), pre.final_norm(pre.embed), rtol=1e-12)
    with pytest.raises(ValueError, match="block index"):
        normalized_embeddings(pre, at=L)


def test_table1_distances_vanish_on_the_sphere_and_scale_as_predicted():
    rng = np.random.default_rng(8)
    rows = rng.normal(size=(VOCAB // 2, D))
    rows -= rows.mean(-1, keepdims=True)
    rows *= np.sqrt(D) / np.linalg.norm(rows, axis=-1, keepdims=True)
    on_sphere = np.concatenate([rows, -rows])  # already normalized, mean embedding zero
    distances = embedding_distances(_checkpoint(8, kind="layer", embed=on_sphere))
    for setting in ("original", "centered", "scaled", "centered_scaled"):
        for value in distances[setting].values():
            assert abs(value) < 1e-10, (setting, distances[setting])
    np.testing.assert_allclose(distances["norms"]["mean"], np.sqrt(D))
    # Shrunk by 0.1: same directions, l2 distance (1 - 0.1) sqrt(d); scaling undoes it.
    shrunk = embedding_distances(_checkpoint(8, kind="layer", embed=0.1 * on_sphere))
    np.testing.assert_allclose(shrunk["original"]["l2_mean"], 0.9 * np.sqrt(D), rtol=1e-10)
    assert shrunk["original"]["cosine_mean"] < 1e-12 and shrunk["scaled"]["l2_mean"] < 1e-10
    assert "Centered + scaled" in distance_table(shrunk)


def test_logit_lens_ends_at_the_model_logits_and_the_token_path(tmp_path):
    ck = _checkpoint(9)
    rng = np.random.default_rng(9)
    n = 6
    ids = rng.integers(0, VOCAB, size=n)
    # The lens is a read-out of whatever states it is given: random residual states
    # (growing with depth, as a residual stream does) test it as well as a forward pass.
    hidden = jnp.asarray(rng.normal(size=(L + 1, n, D)) * np.sqrt(1 + np.arange(L + 1))[:, None, None])
    lens = logit_lens(ck, hidden)
    np.testing.assert_allclose(lens[-1], ck.logits(hidden[-1]), rtol=1e-12, atol=1e-12)
    path = token_path(ck, hidden, Names(), position=3, top=4, ids=ids, cloud=50)
    expected = np.argsort(-np.asarray(ck.logits(hidden[-1]))[3])[:4]
    np.testing.assert_array_equal(path["candidate_id"].values[-1], expected)
    probabilities = jax.nn.softmax(lens[:, 3], axis=-1)
    np.testing.assert_allclose(path["next_probability"].values, probabilities[:, ids[4]], rtol=1e-10)
    assert path.attrs["token"] == f"tok{ids[3]}" and path.attrs["next_token"] == f"tok{ids[4]}"
    assert path["path"].shape == (L + 1, 3) and path["cloud_is_candidate"].values.sum() >= 4
    draw_token_path(path, tmp_path, "path")
    assert sorted(p.name for p in tmp_path.glob("path.*")) == ["path.pdf", "path.png"]
    # An encoder without an LM head reads through its embedding matrix.
    bert = _checkpoint(10, kind="layer", family="bert", arrangement="post", lm_head=False)
    states = jnp.asarray(rng.normal(size=(L + 1, n, D)))
    np.testing.assert_allclose(logit_lens(bert, states), states @ bert.embed.T, rtol=1e-12)


def test_minilm_spectra_and_probes():
    """The real MiniLM (BERT, post-LN, no LM head), float32: spectra against float64
    numpy on the full d x d products, and the probes end to end with its tokenizer."""
    from attnflow.checkpoints._load import load_checkpoint, load_tokenizer

    ck = load_checkpoint("minilm")
    ds = head_spectra(ck)
    att = ck.blocks.attention
    q, k, v, o = (np.asarray(w, np.float64) for w in (att.query, att.key, att.value, att.output))
    ends = (0, 0), (ck.depth - 1, ck.heads - 1)  # full d x d products: two heads, to stay fast
    for name, factors, small in (("qk", lambda l, h: q[l, h].T @ k[l, h], k @ np.swapaxes(q, -1, -2)),
                                 ("ov", lambda l, h: o[l, h] @ v[l, h], v @ o)):
        for l, h in ends:
            expected = np.linalg.svd(factors(l, h), compute_uv=False)[: ck.head_dim]
            got = ds[f"{name}_singular"].values[l, h]
            assert np.abs(got - expected).max() / expected.max() < 1e-5
        eigenvalues = np.linalg.eigvals(small)  # every head, float64, d_k x d_k route
        _match(eigenvalues, ds[f"{name}_eig_real"].values + 1j * ds[f"{name}_eig_imag"].values,
               1e-5 * np.abs(eigenvalues).max())
    for name in ("qk", "ov"):  # |lambda|max <= sigma_max for every matrix
        assert (ds[f"{name}_radius"] <= ds[f"{name}_operator_norm"] * (1 + 1e-5)).all()
    decoded = decode_head_vectors(ck, load_tokenizer("minilm"), k=2, top=3, layers=[ck.depth - 1])
    assert decoded["token_id"].shape == (4, 1, ck.heads, 2, 3)
    assert all(isinstance(t, str) and t for t in decoded["token"].values.ravel())
    # Traveling Words' Table 1 observation: normalizing barely turns the embeddings.
    assert embedding_distances(ck)["original"]["cosine_mean"] < 0.01
