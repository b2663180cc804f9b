"""The zoo's data sets and their seeded splits; NumPy only (no PyTorch).

Two data sets, both shipped inside Python packages, so nothing is downloaded:

* ``digits``: scikit-learn's ``load_digits`` (1,797 images of 8 x 8 pixels, values 0..16,
  ten classes; a copy of the UCI optical recognition of handwritten digits test set).
  A copy is kept in ``zoo/data/digits.npz`` so that the tests can check the saved test
  rows without scikit-learn; :func:`digits` refuses a copy that differs from scikit-learn's.
* ``corpus``: lower-cased English text of the Python standard library: the Zen of Python
  (the decoded text of the ``this`` module) and the docstrings of a few modules, written
  once to ``zoo/data/corpus.txt``, which is the data set of record from then on (docstrings
  change between Python versions; the file does not).

Splits (``Split``) are index arrays into the data set: digits rows for the digit models,
window start positions in the corpus for the character model.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import importlib
import inspect
import io
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_DIR = Path(__file__).resolve().parent / "data"
DIGITS_FILE = DATA_DIR / "digits.npz"
CORPUS_FILE = DATA_DIR / "corpus.txt"

#: Fractions of the digits data set in the training, calibration and test sets.
DIGITS_FRACTIONS = (0.6, 0.1, 0.3)

#: The character model's vocabulary: space, four punctuation marks and the 26 letters.
VOCABULARY = " ',-." + "abcdefghijklmnopqrstuvwxyz"
#: Characters the character model reads before predicting the next one.
WINDOW = 16
#: Fractions of the corpus (by position) in the test and calibration blocks.
TEXT_TEST_FRACTION = 0.2
TEXT_CALIB_FRACTION = 0.1

#: Standard library modules whose docstrings (module, public classes and functions)
#: follow the Zen of Python in the corpus.
CORPUS_MODULES = ("textwrap", "json", "heapq", "random", "contextlib", "collections")


@dataclass(frozen=True)
class Split:
    """Seeded, disjoint index sets into a data set."""

    train: np.ndarray
    calib: np.ndarray
    test: np.ndarray

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "calib": len(self.calib), "test": len(self.test)}


def sha256(*arrays: np.ndarray) -> str:
    """SHA-256 of the arrays' bytes (C order), in order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# --- digits -------------------------------------------------------------------------------

def digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits images, uint8 of shape (1797, 8, 8) with values 0..16, and the labels,
    int64 of shape (1797,).

    Reads ``zoo/data/digits.npz``; writes it from scikit-learn's ``load_digits`` when it is
    missing. When scikit-learn is installed, the copy is checked against it.

    Raises
    ------
    RuntimeError
        The copy differs from scikit-learn's data set.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        load_digits = None
    if load_digits is not None:
        bunch = load_digits()
        images = bunch.images.astype(np.uint8)
        labels = bunch.target.astype(np.int64)
        if not DIGITS_FILE.exists():
            DATA_DIR.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(DIGITS_FILE, images=images, labels=labels)
    with np.load(DIGITS_FILE) as f:
        saved_images, saved_labels = f["images"], f["labels"]
    if load_digits is not None and not (np.array_equal(saved_images, images)
                                        and np.array_equal(saved_labels, labels)):
        raise RuntimeError(f"{DIGITS_FILE} differs from scikit-learn's load_digits()")
    return saved_images, saved_labels


def digits_split(n: int, seed: int) -> Split:
    """A seeded shuffle of ``range(n)`` cut into 60 % train, 10 % calibration, 30 % test."""
    order = np.random.default_rng(seed).permutation(n)
    n_train = round(DIGITS_FRACTIONS[0] * n)
    n_calib = round(DIGITS_FRACTIONS[1] * n)
    return Split(train=np.sort(order[:n_train]),
                 calib=np.sort(order[n_train:n_train + n_calib]),
                 test=np.sort(order[n_train + n_calib:]))


# --- text ---------------------------------------------------------------------------------

def normalise(text: str) -> str:
    """Lower-case ``text`` and keep it within :data:`VOCABULARY`: ``:;!?`` become full
    stops, every other character outside the vocabulary a space; runs of spaces or of
    hyphens (rules under docstring headings) become one."""
    text = text.lower()
    text = re.sub(r"[:;!?]", ".", text)
    text = "".join(c if c in VOCABULARY else " " for c in text)
    text = re.sub(r"-+", "-", text)
    return re.sub(r" +", " ", text).strip()


def _is_prose(line: str) -> bool:
    """Whether a docstring line reads as English: no doctest prompt, and at least 70 % of
    its non-blank characters letters (drops example output, code and shell lines)."""
    text = line.strip()
    if text.startswith((">>>", "...", "$")):
        return False
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) >= 0.7 * len(chars)


def _prose(doc: str) -> str:
    """The English lines of a docstring (see :func:`_is_prose`)."""
    return "\n".join(ln for ln in inspect.cleandoc(doc).splitlines() if _is_prose(ln))


def build_corpus() -> str:
    """The corpus from this Python's standard library (see the module docstring)."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the Zen
        import this
    parts = [codecs.decode(this.s, "rot13")]
    for name in CORPUS_MODULES:
        module = importlib.import_module(name)
        docs = [module.__doc__ or ""]
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if (not attr.startswith("_") and getattr(obj, "__module__", None) == name
                    and (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__doc__):
                docs.append(obj.__doc__)
        parts.extend(_prose(d) for d in docs if d)
    return normalise(" ".join(parts))


def corpus() -> str:
    """The corpus of record: ``zoo/data/corpus.txt``, written by :func:`build_corpus`
    when it is missing."""
    if not CORPUS_FILE.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        CORPUS_FILE.write_text(build_corpus() + "\n", encoding="ascii")
    return CORPUS_FILE.read_text(encoding="ascii").rstrip("\n")


def encode(text: str) -> np.ndarray:
    """Vocabulary codes of ``text``, int64."""
    lookup = {c: i for i, c in enumerate(VOCABULARY)}
    return np.array([lookup[c] for c in text], dtype=np.int64)


def text_split(length: int, seed: int) -> Split:
    """Window start positions of a text of ``length`` characters, split by position.

    A window at position ``p`` reads characters ``p .. p + WINDOW - 1`` and predicts
    character ``p + WINDOW``. The text is cut into five blocks of 20 %; seed ``k`` tests on
    block ``4 - k`` (seed 0 on the last 20 %), calibrates on the 10 % of text just before
    it (cyclically) and trains on the rest. A window belongs to a set only when all its
    ``WINDOW + 1`` characters lie in that set's part of the text, so no character is shared
    between a training window and a test or calibration window.
    """
    if not 0 <= seed < 5:
        raise ValueError(f"text_split: seed must be 0..4 (one test block each), not {seed}")
    span = WINDOW + 1
    owner = np.zeros(length, dtype=np.int8)            # 0 train, 1 calibration, 2 test
    block = round(TEXT_TEST_FRACTION * length)
    test_start = (4 - seed) * block
    test_end = length if seed == 0 else test_start + block
    owner[test_start:test_end] = 2
    calib = np.arange(test_start - round(TEXT_CALIB_FRACTION * length), test_start) % length
    owner[calib] = 1
    starts = np.arange(length - span + 1)
    # A window is owned by one set when the owner is constant over its span.
    lo = np.minimum.reduce([owner[starts + i] for i in range(span)])
    hi = np.maximum.reduce([owner[starts + i] for i in range(span)])
    whole = starts[lo == hi]
    kind = owner[whole]
    return Split(train=whole[kind == 0], calib=whole[kind == 1], test=whole[kind == 2])


def windows(codes: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One-hot inputs, float32 of shape (len(starts), WINDOW, len(VOCABULARY)), and the
    next-character labels, int64 of shape (len(starts),), of the windows at ``starts``."""
    index = starts[:, None] + np.arange(WINDOW)[None, :]
    x = np.eye(len(VOCABULARY), dtype=np.float32)[codes[index]]
    return x, codes[starts + WINDOW]
