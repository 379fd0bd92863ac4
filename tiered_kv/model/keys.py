"""Page keys: what names a page on L2 and L3, and the one validator every key passes.

``page_keys(namespace, token_ids, extra=None)`` gives one key per *full* page of a prompt (the
incomplete tail gets none). Keys are chained: page ``i``'s key hashes page ``i-1``'s key, the page's
token ids as fixed-width (4-byte) little-endian integers, and the page's optional extra keys (image
hashes, for example). So the keys of a prefix are a prefix of the keys of every extension, and a key
names the whole prefix up to its page, not only the page's own tokens (SGLang's chain, namespaced).

The chain's root is the digest of a frozen ``Namespace``: model and weights revision, the spec's
fingerprint, the KV quantisation, the layer range, LoRA id, tenant salt and, only for head-sharded
MHA, ``(tp_size, tp_rank)``. Changing any field changes every key, so pages of a bf16 run can never
be read by an fp8 run (SGLang 33268), nor one tenant's by another.

Keys are 128-bit blake2b digests as 32 lowercase hex characters: the same in every process, machine
and Python run (no ``hash()``, no pickles). ``check_key`` is the one validator used by records,
backends and the index: a key is a str of 1..512 printable ASCII characters.

Pure Python + numpy; no torch, so the scheduler side can compute keys.
"""

from __future__ import annotations

import array
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

import numpy as np

from ..errors import ConfigError, IndexValidationError, PageKeyError, SpecError
from .spec import KVSpec

MAX_KEY_BYTES = 512
KEY_DIGEST_BYTES = 16  # 128 bits
_TOKEN_DTYPE = np.dtype("<u4")  # fixed-width little-endian, as SGLang's chain
_TOKEN_MAX = 2**32 - 1


def check_key(key: object, what: str = "page key") -> str:
    """Return ``key`` if it is a str of 1..512 printable ASCII characters, else raise PageKeyError.

    Printable excludes NUL, newlines and other control characters, which file names, Redis
    commands and record headers cannot all carry.
    """
    if not isinstance(key, str):
        raise PageKeyError(f"{what} must be str, got {type(key).__name__}")
    if not key or len(key) > MAX_KEY_BYTES or not key.isascii() or not key.isprintable():
        raise PageKeyError(f"{what} must be 1..{MAX_KEY_BYTES} printable ASCII characters, got {key[:80]!r}")
    return key


def check_keys(keys: object, what: str = "keys") -> list[str]:
    """A list of valid keys from a sequence of str; a single str or bytes is refused."""
    if isinstance(keys, (str, bytes, bytearray)):
        raise PageKeyError(f"{what} must be a sequence of str, not a single {type(keys).__name__}")
    try:
        out = list(keys)  # type: ignore[call-overload]
    except TypeError:
        raise PageKeyError(f"{what} must be a sequence of str, got {type(keys).__name__}") from None
    for i, k in enumerate(out):
        check_key(k, f"{what}[{i}]")
    return out


def _int_pair(value: object) -> tuple[int, int]:
    """``value`` as two ints, or (-1, -1), which every caller's range check refuses: a bool is no
    layer or rank (``(True, True)`` would hash like ``(1, 1)`` under another name), nor is text."""
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value[0], value[1]
    return -1, -1


@dataclass(frozen=True)
class Namespace:
    """Everything that must differ between two caches whose pages may not be exchanged.

    ``tp`` is ``(tp_size, tp_rank)`` and only for head-sharded MHA caches; replicated MLA / NSA
    caches leave it ``None`` (every rank reads the same pages, one rank writes them).
    """

    model: str
    spec_fingerprint: str
    page_size: int
    revision: str = ""
    kv_quant: str = ""
    layer_range: tuple[int, int] = (0, 0)
    lora_id: str = ""
    tenant_salt: str = ""
    tp: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("model", "spec_fingerprint", "revision", "kv_quant", "lora_id", "tenant_salt"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"Namespace.{name} must be str, got {type(getattr(self, name)).__name__}")
        if not self.model:
            raise ConfigError("Namespace.model must not be empty")
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size <= 0:
            raise ConfigError(f"Namespace.page_size must be an int > 0, got {self.page_size!r}")
        start, end = _int_pair(self.layer_range)
        if not 0 <= start <= end:
            raise ConfigError(f"Namespace.layer_range must be (start, end) with 0 <= start <= end, got {self.layer_range!r}")
        # Stored as tuples of ints whatever sequence came in: a list would make the namespace
        # unhashable and unequal to the same namespace built with a tuple.
        object.__setattr__(self, "layer_range", (int(start), int(end)))
        if self.tp is not None:
            size, rank = _int_pair(self.tp)
            if not (size >= 1 and 0 <= rank < size):
                raise ConfigError(f"Namespace.tp must be (tp_size, tp_rank) with 0 <= rank < size, got {self.tp!r}")
            object.__setattr__(self, "tp", (int(size), int(rank)))

    @classmethod
    def for_spec(cls, spec: Any, model: str, **fields: Any) -> "Namespace":
        """The namespace of ``spec`` (a ``KVSpec``): fingerprint, page size, layer range, KV dtype and,
        for MHA, the tensor-parallel shard are taken from it; the rest from ``fields``.

        A ``spec`` that is no ``KVSpec`` (a model name, say) is a SpecError; a field ``Namespace``
        does not have is a ConfigError naming it."""
        if not isinstance(spec, KVSpec):
            raise SpecError(f"Namespace.for_spec: spec must be a KVSpec (nsa_spec(...), a preset's spec), "
                            f"got {type(spec).__name__} {spec!r:.80}")
        unknown = sorted(set(fields) - _NAMESPACE_FIELDS)
        if unknown:
            raise ConfigError(f"Namespace.for_spec: unknown field(s) {', '.join(unknown)}; "
                              f"a Namespace has {', '.join(sorted(_NAMESPACE_FIELDS - {'model'}))}")
        try:
            dims = dict(spec.dims)
        except (TypeError, ValueError):
            raise SpecError(f"Namespace.for_spec: spec.dims must be (name, value) pairs, got {spec.dims!r:.80}") from None
        derived: dict[str, Any] = {
            "spec_fingerprint": spec.fingerprint,
            "page_size": spec.page_size,
            "layer_range": (spec.layer_start, spec.layer_end),
            "kv_quant": dims.get("latent_dtype", dims.get("dtype", "")),
        }
        if spec.kind == "mha" and "tp" in dims:
            try:
                rank, size = (int(x) for x in str(dims["tp"]).split("/"))
            except ValueError:
                raise SpecError(f"Namespace.for_spec: the spec's tp must be 'rank/size', got {dims['tp']!r:.40}") from None
            derived["tp"] = (size, rank)
        derived.update(fields)
        return cls(model=model, **derived)

    @property
    def root(self) -> bytes:
        """The chain's seed: a digest of every field, canonical JSON so it is stable everywhere."""
        cached = self.__dict__.get("_root")
        if cached is None:
            canonical = json.dumps({"tiered_kv_namespace": 1, **asdict(self)}, sort_keys=True, separators=(",", ":"))
            cached = hashlib.blake2b(canonical.encode(), digest_size=KEY_DIGEST_BYTES).digest()
            object.__setattr__(self, "_root", cached)  # frozen: cache without changing identity
        return cached

    def engine_key(self, engine_hash: bytes) -> str:
        """The page key of a page an engine names by its own hash (vLLM's block hash, SGLang's page
        hash): a digest of this namespace's root and that hash, so two namespaces never share it."""
        return hashlib.blake2b(self.root + engine_hash, digest_size=KEY_DIGEST_BYTES).hexdigest()


_NAMESPACE_FIELDS = frozenset(f.name for f in dataclass_fields(Namespace))


def _token_array(token_ids: Any) -> np.ndarray:
    """Token ids as a 1-D little-endian uint32 array; IndexValidationError names a bad one."""
    if hasattr(token_ids, "detach") and hasattr(token_ids, "cpu"):  # a torch tensor, without importing torch
        token_ids = token_ids.detach().cpu().numpy()
    if isinstance(token_ids, (list, tuple)) and token_ids and type(token_ids[0]) is not bool:
        # The common case, a list of Python ints: array('I') converts 128k of them in ~1 ms (numpy
        # takes ~3 ms) and refuses floats, negatives and values above 2**32 - 1 by itself; anything
        # it refuses goes the slow way below, which names the bad element. (A list of bools goes
        # the slow way too and is refused; a bool inside a list of ints counts as the int it is.)
        try:
            fast = array.array("I", token_ids)
        except (TypeError, OverflowError, ValueError):
            fast = None
        if fast is not None and fast.itemsize == _TOKEN_DTYPE.itemsize:
            return np.frombuffer(fast, dtype=np.uint32).astype(_TOKEN_DTYPE, copy=False)
    if isinstance(token_ids, np.ndarray):
        arr = token_ids
    else:
        if isinstance(token_ids, (str, bytes)):
            raise IndexValidationError("token_ids must be a sequence of ints, not a str/bytes")
        if not isinstance(token_ids, Iterable):
            raise IndexValidationError(f"token_ids must be a sequence of ints, got {type(token_ids).__name__}")
        # asarray, not fromiter(int64): fromiter truncates floats (1.5 -> 1) and takes bools as
        # 0/1 silently, which would give a wrong prompt a valid key; asarray keeps their dtype.
        try:
            arr = np.asarray(token_ids)
        except (TypeError, ValueError, OverflowError):
            arr = None
        if arr is not None and arr.size == 0 and arr.ndim == 1:
            arr = arr.astype(np.int64)  # [] is float64 to numpy: an empty prompt, no keys
        if arr is None or arr.dtype.kind not in "iu" or arr.ndim != 1:
            for i, t in enumerate(token_ids):
                if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t <= _TOKEN_MAX:
                    raise IndexValidationError(f"token_ids[{i}] must be an int in 0..{_TOKEN_MAX}, got {t!r}")
            raise IndexValidationError("token_ids must be a sequence of ints")
    if arr.ndim != 1:
        raise IndexValidationError(f"token_ids must be 1-D, got shape {tuple(arr.shape)}")
    if arr.dtype.kind == "b" or arr.dtype.kind not in "iu":
        raise IndexValidationError(f"token_ids must be integers, got dtype {arr.dtype}")
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > _TOKEN_MAX:
            bad = int(np.flatnonzero((arr < 0) | (arr > _TOKEN_MAX))[0])
            raise IndexValidationError(f"token_ids[{bad}] must be in 0..{_TOKEN_MAX}, got {int(arr[bad])}")
    return arr.astype(_TOKEN_DTYPE, copy=False)


def _extra_bytes(extra: object, page: int) -> bytes:
    """Length-prefixed encoding of one page's extra keys (so ``["ab", "c"]`` != ``["a", "bc"]``)."""
    if extra is None:
        return b""
    items = [extra] if isinstance(extra, (str, bytes, bytearray, memoryview)) else extra
    out = bytearray(b"\x01")
    bad = IndexValidationError(f"extra[{page}] must be str, bytes or a list of them, got {extra!r:.80}")
    if not isinstance(items, Sequence):  # a set or dict has no order to hash
        raise bad
    for item in items:  # type: ignore[union-attr]
        # bytes(5) is five zero bytes, and bytes([...]) of ints another encoding: only str and
        # bytes-like items are keys, so an int hash can never collide with a byte string.
        if isinstance(item, str):
            raw = item.encode()
        elif isinstance(item, (bytes, bytearray, memoryview)):
            raw = bytes(item)
        else:
            raise bad
        out += len(raw).to_bytes(4, "little") + raw
    return bytes(out)


def _parent_digest(parent: object) -> bytes:
    key = check_key(parent, "parent")
    try:
        digest = bytes.fromhex(key)
    except ValueError:
        digest = b""
    if len(digest) != KEY_DIGEST_BYTES:
        raise PageKeyError(f"parent must be a key made by page_keys ({2 * KEY_DIGEST_BYTES} hex characters), got {key[:80]!r}")
    return digest


def page_keys(namespace: Namespace, token_ids: Any, extra: Sequence[object] | None = None, *,
              parent: str | None = None) -> list[str]:
    """One key per full page of ``token_ids`` (list, numpy array or tensor of ints).

    ``extra[i]``: optional extra keys of page ``i`` (str / bytes, or a list of them; None for none),
    such as the hashes of images whose tokens the page holds. It may be shorter than the pages
    (the rest have none) or longer (entries of the incomplete tail, or of the rest of the prompt
    when keying a prefix with the whole prompt's list, are ignored), so the keys of a prefix stay
    a prefix of the keys of its extensions. ``parent``: the key of the page before
    ``token_ids[0]``, to continue a chain; None starts at the namespace's root.
    """
    if not isinstance(namespace, Namespace):
        raise ConfigError(f"page_keys needs a Namespace, got {type(namespace).__name__}")
    tokens = _token_array(token_ids)
    page_size = namespace.page_size
    num_pages = tokens.size // page_size
    if extra is not None:
        if isinstance(extra, (str, bytes)):
            raise IndexValidationError("extra must be a sequence with one entry per page, not a single str/bytes")
        if not isinstance(extra, Iterable):
            raise IndexValidationError(f"extra must be a sequence with one entry per page, got {type(extra).__name__}")
        extra = list(extra)
        # Entries past the full pages belong to the tail (or to the rest of a longer prompt whose
        # prefix is keyed here): they name no page, so they are checked but do not count.
        for i in range(num_pages, len(extra)):
            _extra_bytes(extra[i], i)
    prev = namespace.root if parent is None else _parent_digest(parent)
    raw = tokens[: num_pages * page_size].tobytes()
    step = page_size * _TOKEN_DTYPE.itemsize
    keys: list[str] = []
    blake2b = hashlib.blake2b
    for i in range(num_pages):
        h = blake2b(prev, digest_size=KEY_DIGEST_BYTES)
        h.update(raw[i * step:(i + 1) * step])
        if extra is not None and i < len(extra) and extra[i] is not None:
            h.update(_extra_bytes(extra[i], i))
        prev = h.digest()
        keys.append(prev.hex())
    return keys


__all__ = ["MAX_KEY_BYTES", "Namespace", "check_key", "check_keys", "page_keys"]
