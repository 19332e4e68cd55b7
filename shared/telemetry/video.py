"""Videos of a policy acting: frames rendered by an env (`render_mode="rgb_array"`) to MP4.

imageio with its ffmpeg plugin (the `video` extra: the imageio-ffmpeg wheel ships an ffmpeg
binary) writes H.264 that browsers, TensorBoard's users and W&B all play. Frame sizes are
padded to even numbers, which H.264's 4:2:0 sampling needs (CartPole renders 600x400, but a
user env may not).
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class VideoUnavailable(RuntimeError):
    """The `video` extra is not installed, or the env cannot render frames."""


def _even(frames: np.ndarray) -> np.ndarray:
    h, w = frames.shape[1:3]
    return np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")


def stack_frames(frames: Sequence[np.ndarray]) -> np.ndarray:
    """(T, H, W, 3) uint8 from a list of rendered frames (an RGBA render drops alpha)."""
    if not frames:
        raise VideoUnavailable("no frames were rendered")
    arr = np.stack([np.asarray(f) for f in frames])
    if arr.ndim != 4 or arr.shape[-1] not in (3, 4):
        raise VideoUnavailable(f"rendered frames have shape {arr.shape[1:]}, not (H, W, 3)")
    return np.ascontiguousarray(arr[..., :3].astype(np.uint8, copy=False))


def encode_mp4(frames: Sequence[np.ndarray] | np.ndarray, fps: int = 30) -> bytes:
    """The frames as MP4 bytes (H.264, yuv420p)."""
    try:
        import imageio.v3 as iio
    except ImportError as err:  # pragma: no cover - the extra is part of `make test`
        raise VideoUnavailable("videos need the video extra: pip install 'rlfleet[video]'"
                               ) from err
    arr = _even(frames if isinstance(frames, np.ndarray) else stack_frames(frames))
    with tempfile.TemporaryDirectory() as tmp:  # ffmpeg wants a seekable file for MP4
        path = Path(tmp) / "video.mp4"
        try:
            # imageio-ffmpeg's plugin; frames are even already, so no resizing to 16s
            iio.imwrite(path, arr, plugin="FFMPEG", fps=fps, codec="libx264",
                        macro_block_size=1)
        except (ImportError, OSError, RuntimeError, ValueError) as err:
            raise VideoUnavailable(f"cannot encode MP4: {err}") from err
        return path.read_bytes()


def encode_gif(frames: np.ndarray, fps: float = 30, max_side: int = 200) -> bytes:
    """A small GIF of the frames (TensorBoard's image plugin animates an encoded GIF): every
    frame shrunk by an integer stride so the longer side is at most `max_side` pixels."""
    import imageio.v3 as iio

    stride = max(1, -(-max(frames.shape[1:3]) // max_side))
    small = np.ascontiguousarray(frames[:, ::stride, ::stride])
    buf = io.BytesIO()
    iio.imwrite(buf, small, extension=".gif", duration=1000 / fps, loop=0)
    return buf.getvalue()


class Mp4Writer:
    """An MP4 written a frame at a time (a 600x400 frame is 0.7 MB: a 3,000-frame episode
    held whole would be 2 GB), plus a thumbnail GIF of between `gif_frames` and twice as many
    frames: whenever the thumbnail doubles that, every other frame goes and the stride
    doubles, so any length of video fits."""

    def __init__(self, path: str | Path, fps: int = 30, gif_frames: int = 100,
                 gif_max_side: int = 200) -> None:
        try:
            import imageio.v2 as iio2
        except ImportError as err:  # pragma: no cover - the extra is part of `make test`
            raise VideoUnavailable("videos need the video extra: pip install "
                                   "'rlfleet[video]'") from err
        self.path, self.fps, self.frames = Path(path), fps, 0
        self._gif: list[np.ndarray] = []
        self._gif_cap, self._gif_side, self._stride = gif_frames, gif_max_side, 1
        try:
            self._writer = iio2.get_writer(self.path, format="FFMPEG", fps=fps,
                                           codec="libx264", macro_block_size=1)
        except (ImportError, OSError, RuntimeError, ValueError) as err:
            raise VideoUnavailable(f"cannot write MP4: {err}") from err

    def add(self, frame: np.ndarray) -> None:
        frame = stack_frames([frame])
        self._writer.append_data(_even(frame)[0])
        if self.frames % self._stride == 0:
            step = max(1, -(-max(frame.shape[1:3]) // self._gif_side))
            self._gif.append(np.ascontiguousarray(frame[0, ::step, ::step]))
            if len(self._gif) >= 2 * self._gif_cap:
                del self._gif[1::2]
                self._stride *= 2
        self.frames += 1

    def close(self) -> None:
        self._writer.close()

    def gif(self) -> bytes:
        """The thumbnail, playing in the video's time (each frame lasts `stride` frames)."""
        if not self._gif:
            raise VideoUnavailable("no frames were rendered")
        return encode_gif(np.stack(self._gif), self.fps / self._stride, max_side=10**6)


def read_frames(path: str | Path) -> np.ndarray:
    """All frames of a video file, (T, H, W, 3)."""
    import imageio.v3 as iio

    return iio.imread(path)
