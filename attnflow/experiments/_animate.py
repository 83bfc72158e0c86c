"""Token paths to look at, not only to print: an interactive 3-D view of the sphere with
a time slider (a self-contained plotly HTML file that opens offline) and an animation
of the tokens on the sphere or the circle (a GIF, or an MP4 where ffmpeg exists).

Both take the states of one system, `x` of shape (time, token, dim), with their times,
and show at most a few dozen to a hundred instants (evenly spread over the saved
times), so that the files stay small. A sphere (or circle) is drawn under the tokens
when they lie on it; tokens off the unit sphere (a run without normalization) are
drawn in their own box. plotly.js is inside each HTML page, or in one plotly.min.js
beside the pages (`plotly_js`). plotly and matplotlib are imported inside the functions.
Titles are matplotlib mathtext (`$S^2$`, `$\\beta$`); the HTML view writes them as plotly
text (`plotly_text`), since plotly draws LaTeX only with MathJax, which the offline page
does not load.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from ..presentation._figures import figure, styled
from ..running._progress import Progress
from ..schema._errors import ConfigError
from ..storage._store import write_atomically
from ._lazy import lazy

if TYPE_CHECKING:
    import xarray as xr
    from jaxtyping import Float
    from mpl_toolkits.mplot3d import Axes3D
else:
    xr = lazy("xarray")

# The tab10 colors of the matplotlib figures, so a token has one color everywhere.
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
# The HTML stores every trail up to every shown instant (about n F^2 / 2 points for F
# instants): F is capped so that this stays near 2e5 points (a few MB at most).
_HTML_POINTS = 200_000
_HTML_FRAMES = 120
# Where an HTML view finds plotly.js (`plotly_js`): plotly's `include_plotlyjs` for each choice.
PLOTLY_JS = {"embed": True, "directory": "directory"}
# The math of a mathtext label, and its pieces: a sub- or superscript (a {group} or one
# character), a command (\beta, \,), a run of Latin letters, a brace.
_MATH = re.compile(r"\$([^$]*)\$")
_TEX = re.compile(r"([_^])(?:\{([^{}]*)\}|(\\[A-Za-z]+|.))|\\([A-Za-z]+|.)|([A-Za-z]+)|[{}]")
# The commands other than Greek letters that a plotly label writes as a character.
_SYMBOLS = {",": "\u2009", ";": " ", " ": " ", "to": "→", "infty": "∞", "cdot": "·", "langle": "⟨", "rangle": "⟩"}


def plotly_text(label: str) -> str:
    """A matplotlib mathtext label as plotly text: each `$...$` becomes Unicode and the
    HTML tags plotly draws, Latin letters in <i>, `_`/`^` as <sub>/<sup>, Greek letters
    as themselves (`"on $S^2$, $\\beta$ = 1"` -> `"on <i>S</i><sup>2</sup>, β = 1"`)."""
    return _MATH.sub(lambda math: _plotly_math(math.group(1)), label)


def _plotly_math(tex: str) -> str:
    def piece(match: re.Match[str]) -> str:
        script, group, single, command, letters = match.groups()
        if script:
            tag = "sup" if script == "^" else "sub"
            return f"<{tag}>{_plotly_math(group if group is not None else single)}</{tag}>"
        if command:
            case = "CAPITAL" if command[0].isupper() else "SMALL"
            try:  # unicodedata spells lambda "LAMDA"
                return unicodedata.lookup(f"GREEK {case} LETTER {command.upper().replace('LAMBDA', 'LAMDA')}")
            except KeyError:
                return _SYMBOLS.get(command, command)
        return f"<i>{letters}</i>" if letters else ""

    return _TEX.sub(piece, tex)


def check_plotly_js(plotly_js: str) -> None:
    if plotly_js not in PLOTLY_JS:
        raise ConfigError(f"plotly_js={plotly_js!r} is not a choice; give one of {', '.join(PLOTLY_JS)}.")


def _frames(count: int, limit: int) -> np.ndarray:
    """At most `limit` indices into `count` saved times, evenly spread, first and last kept."""
    if count <= limit:
        return np.arange(count)
    return np.unique(np.round(np.linspace(0, count - 1, limit)).astype(int))


def _on_sphere(x: np.ndarray) -> bool:
    norms = np.linalg.norm(x, axis=-1)
    finite = norms[np.isfinite(norms)]
    return finite.size > 0 and bool(np.all(np.abs(finite - 1) < 1e-3))


def _extent(x: np.ndarray, sphere: bool) -> float:
    if sphere:
        return 1.1
    finite = np.abs(x[np.isfinite(x)])
    return 1.1 * float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def _view(last: np.ndarray) -> tuple[float, float]:
    """(elevation, azimuth) in degrees of the mean direction of the last states."""
    mean = np.nanmean(last, axis=0) if np.isfinite(last).any() else np.zeros(3)
    if not np.all(np.isfinite(mean)) or np.linalg.norm(mean) < 1e-6:
        return 20.0, -60.0
    mean = mean / np.linalg.norm(mean)
    return float(np.degrees(np.arcsin(np.clip(mean[2], -1, 1)))), float(np.degrees(np.arctan2(mean[1], mean[0])))


def _check(x: np.ndarray, times: np.ndarray, dims: tuple[int, ...]) -> None:
    if x.shape[-1] not in dims:
        allowed = " or ".join(str(d) for d in dims)
        raise ConfigError(f"these tokens live in d = {x.shape[-1]} dimensions; this view draws d = {allowed}.")
    if x.shape[0] == 0:
        raise ConfigError("there are no saved states to draw (the time axis is empty).")
    if times.shape != (x.shape[0],):
        raise ConfigError(f"{times.size} times were given for {x.shape[0]} saved states; give one time per state.")


def sphere_html(
    x: Float[np.ndarray, "time token 3"],
    times: Float[np.ndarray, " time"],
    path: str | os.PathLike,
    title: str = "token paths on the sphere",
    *,
    plotly_js: str = "embed",
) -> Path:
    """An interactive 3-D figure of token paths on $S^2$, written as one HTML file.

    Each token is a marker at the chosen time with its path so far behind it; a slider
    picks the time and a play button runs through them. The unit sphere is drawn
    translucent under the tokens when they lie on it. `plotly_js` says where plotly's
    JavaScript is: `"embed"` inside the file (it opens offline, a few MB), or
    `"directory"` in one `plotly.min.js` beside it, shared by every page of the folder
    (the pages are then a few hundred kB; the folder opens offline as a whole). The
    file is written whole or not at all.
    """
    import plotly.graph_objects as go  # lazy: start-up

    check_plotly_js(plotly_js)
    x = np.asarray(x, dtype=float)
    times = np.asarray(times, dtype=float)
    _check(x, times, (3,))
    n = x.shape[1]
    limit = int(min(_HTML_FRAMES, max(20, np.sqrt(2 * _HTML_POINTS / n))))
    shown = _frames(x.shape[0], limit)
    sphere = _on_sphere(x)
    extent = _extent(x, sphere)
    colors = [_COLORS[i % len(_COLORS)] for i in range(n)]
    # One trace for all trails (tokens separated by NaN gaps, colored by token index
    # through a stepwise color scale) and one for all markers keep each frame small.
    scale = [[i / max(n - 1, 1), colors[i]] for i in range(n)] if n > 1 else [[0, colors[0]], [1, colors[0]]]

    def trails(k: int) -> go.Scatter3d:
        path = x[shown[: k + 1]]  # (steps, token, 3)
        gap = np.full((1, n, 3), np.nan)
        # float32 is far finer than the eye needs and halves the file's frames.
        points = np.concatenate([path, gap]).transpose(1, 0, 2).reshape(-1, 3).astype(np.float32)
        token = np.repeat(np.arange(n), path.shape[0] + 1).astype(np.float32)
        line = {"color": token, "colorscale": scale, "cmin": 0, "cmax": max(n - 1, 1), "width": 4}
        return go.Scatter3d(
            x=points[:, 0],
            y=points[:, 1],
            z=points[:, 2],
            mode="lines",
            name="paths",
            line=line,
            hoverinfo="skip",
            showlegend=False,
        )

    def markers(k: int) -> go.Scatter3d:
        now = x[shown[k]].astype(np.float32)
        marker = {"size": 5, "color": colors, "line": {"width": 0.5, "color": "black"}}
        return go.Scatter3d(
            x=now[:, 0],
            y=now[:, 1],
            z=now[:, 2],
            mode="markers",
            name="tokens",
            marker=marker,
            text=[f"token {i}" for i in range(n)],
            hovertemplate="%{text}<br>(%{x:.3f}, %{y:.3f}, %{z:.3f})<extra></extra>",
            showlegend=False,
        )

    data = []
    if sphere:
        u, v = np.mgrid[0 : 2 * np.pi : 48j, 0 : np.pi : 24j]
        data.append(
            go.Surface(
                x=np.cos(u) * np.sin(v),
                y=np.sin(u) * np.sin(v),
                z=np.cos(v),
                opacity=0.15,
                colorscale=[[0, "#b0b0b0"], [1, "#b0b0b0"]],
                showscale=False,
                hoverinfo="skip",
                name="unit sphere",
            )
        )
    moving = [len(data), len(data) + 1]  # the frames replace these traces only
    data += [trails(0), markers(0)]
    frames = [go.Frame(data=[trails(k), markers(k)], traces=moving, name=str(k)) for k in range(len(shown))]
    still = {"duration": 0}
    step = {"mode": "immediate", "frame": {**still, "redraw": True}, "transition": still}
    slider = {
        "active": 0,
        "x": 0.1,
        "len": 0.88,
        "y": 0.02,
        "currentvalue": {"prefix": plotly_text("$t$ = "), "font": {"size": 13}},
        "steps": [
            {"method": "animate", "label": f"{times[i]:.3g}", "args": [[str(k)], step]} for k, i in enumerate(shown)
        ],
    }
    run = {"mode": "immediate", "fromcurrent": True, "frame": {"duration": 60, "redraw": True}, "transition": still}
    play = {
        "type": "buttons",
        "direction": "left",
        "x": 0.0,
        "y": 0.02,
        "xanchor": "left",
        "yanchor": "top",
        "showactive": False,
        "buttons": [
            {"label": "play", "method": "animate", "args": [None, run]},
            {"label": "pause", "method": "animate", "args": [[None], step]},
        ],
    }
    axis = {"range": [-extent, extent], "showbackground": False, "zeroline": False}
    fig = go.Figure(data=data, frames=frames)
    fig.update_layout(
        title={"text": plotly_text(title), "x": 0.02},
        sliders=[slider],
        updatemenus=[play],
        margin={"l": 0, "r": 0, "t": 40, "b": 0},
        height=700,
        scene={
            "xaxis": {**axis, "title": plotly_text("$x_1$")},
            "yaxis": {**axis, "title": plotly_text("$x_2$")},
            "zaxis": {**axis, "title": plotly_text("$x_3$")},
            "aspectmode": "cube",
        },
    )
    path = Path(path)
    if plotly_js == "directory":
        # plotly's "directory" mode only names the script: write it beside the page,
        # replacing one another plotly version may have left there.
        from plotly.offline import get_plotlyjs  # lazy: start-up

        write_atomically(
            path.parent / "plotly.min.js",
            lambda tmp: Path(tmp).write_text(get_plotlyjs(), encoding="utf-8"),  # pyright: ignore[reportArgumentType]  # write_text's count is unused (annotated None)
        )
    return write_atomically(
        path,
        lambda tmp: fig.write_html(
            tmp, include_plotlyjs=PLOTLY_JS[plotly_js], full_html=True, auto_play=False, config={"displaylogo": False}
        ),
    )


@styled
def animation(
    x: Float[np.ndarray, "time token dim"],
    times: Float[np.ndarray, " time"],
    path: str | os.PathLike,
    title: str = "token paths",
    *,
    frames: int = 60,
    fps: int = 12,
    dpi: int = 80,
) -> Path:
    """An animation of the tokens on the sphere $S^2$ (d = 3, 3-D axes looking at where
    the tokens end up) or on the circle (d = 2), each token a marker with its path so
    far.

    Written as a GIF (matplotlib's pillow writer) when `path` ends in .gif, as an MP4
    when it ends in .mp4 and ffmpeg is installed; at most `frames` instants evenly
    spread over the saved times, at `dpi` (a GIF of a few hundred kB). The file is
    written whole or not at all.
    """
    from matplotlib import animation as mpl_animation  # lazy: start-up

    x = np.asarray(x, dtype=float)
    times = np.asarray(times, dtype=float)
    _check(x, times, (2, 3))
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".gif":
        writer = mpl_animation.PillowWriter(fps=fps)
    elif suffix == ".mp4":
        if not mpl_animation.FFMpegWriter.isAvailable():
            raise ConfigError(f"cannot write {path}: ffmpeg is not installed; write a .gif instead.")
        writer = mpl_animation.FFMpegWriter(fps=fps)
    else:
        raise ConfigError(f"cannot write an animation to {path}; give a path ending in .gif or .mp4.")

    shown = _frames(x.shape[0], frames)
    n, d = x.shape[1], x.shape[2]
    sphere = _on_sphere(x)
    extent = _extent(x, sphere)
    colors = [_COLORS[i % len(_COLORS)] for i in range(n)]
    three = d == 3
    fig = figure(figsize=(4.0, 4.0))
    if three:
        ax = cast("Axes3D", fig.add_axes((0.0, 0.0, 1.0, 0.9), projection="3d"))
        if sphere:
            u, v = np.mgrid[0 : 2 * np.pi : 30j, 0 : np.pi : 15j]
            ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.8", linewidth=0.3)
        ax.set_zlim(-extent, extent)
        ax.set_box_aspect((1, 1, 1), zoom=1.35)  # pyright: ignore[reportArgumentType]  # the stub types zoom int; it is a float factor
        # A fixed view (a turning one makes a GIF ten times larger), looking at where
        # the tokens end up.
        ax.view_init(*_view(x[-1]))
        ax.set_axis_off()
    else:
        from matplotlib.ticker import MaxNLocator  # lazy: start-up

        ax = fig.add_axes((0.16, 0.1, 0.8, 0.76))
        if sphere:
            angle = np.linspace(0, 2 * np.pi, 200)
            ax.plot(np.cos(angle), np.sin(angle), color="0.75", linewidth=0.8)
        ax.set_aspect("equal")
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.yaxis.set_major_locator(MaxNLocator(5))
        ax.set_xlabel("$x_1$")
        ax.set_ylabel("$x_2$")
    ax.set_xlim(-extent, extent)
    ax.set_ylim(-extent, extent)
    lines = [ax.plot(*([[]] * d), color=colors[i], linewidth=1.2)[0] for i in range(n)]
    dots = [
        ax.plot(*([[]] * d), "o", color=colors[i], markersize=5, markeredgecolor="k", markeredgewidth=0.4)[0]
        for i in range(n)
    ]
    label = fig.suptitle(title, fontsize=9, y=0.98)

    def update(k: int):
        path_so_far = x[shown[: k + 1]]
        for i in range(n):
            if three:
                lines[i].set_data_3d(*path_so_far[:, i].T)  # pyright: ignore[reportAttributeAccessIssue]  # a Line3D on 3d axes
                dots[i].set_data_3d(*path_so_far[-1:, i].T)  # pyright: ignore[reportAttributeAccessIssue]  # a Line3D on 3d axes
            else:
                lines[i].set_data(*path_so_far[:, i].T)
                dots[i].set_data(*path_so_far[-1:, i].T)
        label.set_text(f"{title}\nt = {times[shown[k]]:.3g}")
        return [*lines, *dots, label]

    movie = mpl_animation.FuncAnimation(fig, update, frames=len(shown), blit=False)

    def write(tmp: Path) -> None:
        # The writers pick the format from the file name: write under the real suffix
        # in a scratch folder, then move the file to the temporary name.
        with (
            tempfile.TemporaryDirectory(prefix="attnflow-animation-") as scratch,
            Progress(f"animation {path.name}", len(shown), unit="frames") as bar,
        ):
            out = Path(scratch) / f"animation{suffix}"
            movie.save(out, writer=writer, dpi=dpi, progress_callback=lambda i, count: bar.advance())
            shutil.move(out, tmp)

    return write_atomically(path, write)


def animate_states(
    ds: xr.Dataset,
    folder: str | os.PathLike,
    name: str,
    member: int = 0,
    title: str | None = None,
    *,
    plotly_js: str = "embed",
) -> list[Path]:
    """The interactive view and the animation of one member's stored states `x`
    (`save_states: true`): `name.html` and `name.gif` in `folder` when d = 3, `name.gif`
    when d = 2, nothing otherwise (or when the states were not stored). `plotly_js`:
    plotly.js inside the page (`"embed"`) or in one `plotly.min.js` beside it
    (`"directory"`), as `sphere_html` says.

    `ds["x"]` has dims (member, time, token, dim); any other dim (a beta, a panel) is
    taken at its first entry: select the one to draw first (`ds.isel(beta=2)`).
    """
    if "x" not in ds:
        return []
    states = ds["x"].isel(member=member) if "member" in ds["x"].dims else ds["x"]
    states = states.isel({dim: 0 for dim in states.dims if dim not in ("time", "token", "dim")})
    x = states.transpose("time", "token", "dim").values.astype(float)
    times = ds["time"].values.astype(float)
    d = x.shape[-1]
    folder = Path(folder)
    title = title or f"{x.shape[1]} tokens, member {member}"
    paths = []
    if d == 3:
        paths.append(sphere_html(x, times, folder / f"{name}.html", title=title, plotly_js=plotly_js))
        if plotly_js == "directory":
            paths.append(folder / "plotly.min.js")
    if d in (2, 3):
        paths.append(animation(x, times, folder / f"{name}.gif", title=title))
    return paths
