"""Benchmark workloads: what each request asks for (random prompt token ids, output length) and when it arrives.

Everything draws from a `random.Random` it is given, so a seed makes a run repeatable.
"""
from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    output_len: int
    arrival: float | None = None  # seconds after the start, from a trace; None: the load point decides


@dataclass(frozen=True)
class LengthRange:
    """A token count: fixed (`lo == hi`) or uniform in [lo, hi]."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str) -> LengthRange:
        """`N` or `LO:HI`, with 1 <= LO <= HI."""
        lo, sep, hi = str(text).strip().partition(":")
        try:
            span = cls(int(lo), int(hi) if sep else int(lo))
        except ValueError:
            raise ValueError(f"expected N or LO:HI (token counts), got {text!r}") from None
        if not 1 <= span.lo <= span.hi:
            raise ValueError(f"expected 1 <= LO <= HI, got {text!r}")
        return span

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.lo, self.hi)

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


_WORD = 32  # bits in one output of the generator (Mersenne Twister)


def random_prompt(rng: random.Random, length: int, vocab_size: int, ids: bool = True) -> list[int]:
    """`length` draws of `rng.randrange(vocab_size)`, the same ids from the same state: randrange draws
    `vocab_size.bit_length()` bits until they fall below it, done here in batches of as many draws as ids are
    missing (never more, so the generator ends where randrange's would), at C speed. Without `ids`, as many stand-ins
    (0) after the same draws: for the planner, where only a prompt's length counts (prompts sharing no block), the
    cost of making each id an int saved."""
    if vocab_size < 1:
        raise ValueError(f"a vocabulary of {vocab_size} token ids: expected at least 1")
    bits = vocab_size.bit_length()
    if not ids:
        kept = 0
        while kept < length:
            kept += _draws_below(rng, bits, length - kept, vocab_size, count=True)
        return [0] * length
    drawn = []
    while len(drawn) < length:
        drawn += _draws_below(rng, bits, length - len(drawn), vocab_size)
    return drawn


def _draws_below(rng: random.Random, bits: int, n: int, below: int, count: bool = False) -> list[int] | int:
    """Those of `n` draws of `rng.getrandbits(bits)` that are below `below` (with `count`, how many). Up to 32 bits, a
    draw is the top `bits` of one 32-bit word of the generator, and one `getrandbits(32 * n)` gives the same n words
    (the first lowest): drawn in one call, split and filtered as an array."""
    if bits > _WORD:
        kept = [r for r in map(rng.getrandbits, itertools.repeat(bits, n)) if r < below]
        return len(kept) if count else kept
    words = np.frombuffer(rng.getrandbits(_WORD * n).to_bytes(4 * n, "little"), dtype="<u4") >> (_WORD - bits)
    return int(np.count_nonzero(words < below)) if count else words[words < below].tolist()


# ---- synthetic mixes ----------------------------------------------------------------------------
def random_requests(rng: random.Random, n: int, vocab_size: int, input_len: LengthRange,
                    output_len: LengthRange, ids: bool = True) -> list[BenchRequest]:
    """Fixed or uniform prompt and output lengths (`ids`: random_prompt's)."""
    return [BenchRequest(random_prompt(rng, input_len.sample(rng), vocab_size, ids), output_len.sample(rng))
            for _ in range(n)]


def long_short_mix(rng: random.Random, n: int, vocab_size: int, input_len: LengthRange, output_len: LengthRange,
                   long_input_len: LengthRange, long_output_len: LengthRange,
                   long_fraction: float, ids: bool = True) -> list[BenchRequest]:
    """`round(n * long_fraction)` long-prompt/short-answer requests at random positions among ordinary ones.

    Long prefills stall a colocated engine's decodes; this is the mix where disaggregation should pay.
    """
    longs = set(rng.sample(range(n), round(n * long_fraction)))
    requests = []
    for i in range(n):
        ins, outs = (long_input_len, long_output_len) if i in longs else (input_len, output_len)
        requests.append(BenchRequest(random_prompt(rng, ins.sample(rng), vocab_size, ids), outs.sample(rng)))
    return requests


def shared_prefix_mix(rng: random.Random, n: int, vocab_size: int, prefix_len: int, num_prefixes: int,
                      input_len: LengthRange, output_len: LengthRange) -> list[BenchRequest]:
    """Each prompt is one of `num_prefixes` system prompts of `prefix_len` tokens plus its own `input_len` tokens."""
    prefixes = [random_prompt(rng, prefix_len, vocab_size) for _ in range(num_prefixes)]
    return [BenchRequest(rng.choice(prefixes) + random_prompt(rng, input_len.sample(rng), vocab_size),
                         output_len.sample(rng))
            for _ in range(n)]


def prefixes_to_fill(cache_tokens: int, workers: int, prefix_len: int, fill: float = 0.75) -> int:
    """How many distinct system prompts of `prefix_len` tokens fit in `workers` prefix caches of `cache_tokens`
    each together (within `fill` of their sum) but not in one: where placing a prefix where it is cached pays,
    and placing by load alone makes every cache hold every prefix and thrash. Raises ValueError where no count
    does both."""
    most = int(fill * workers * cache_tokens) // prefix_len
    fewest = cache_tokens // prefix_len + 1
    if workers < 2 or most < fewest:
        raise ValueError(f"no number of {prefix_len}-token prefixes fits {workers} caches of {cache_tokens} tokens "
                         f"together but not one (needs 2+ workers and prefixes well under a cache)")
    return most


# ---- traces -------------------------------------------------------------------------------------
TRACE_FIELDS = ("arrival", "input_len", "output_len")
CSV_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True)
class TraceEntry:
    arrival: float  # seconds, any origin
    input_len: int
    output_len: int


def parse_trace(lines: Iterable[str], source: str = "trace") -> list[TraceEntry]:
    """JSON lines `{"arrival": s, "input_len": n, "output_len": n}` (other keys ignored), sorted by arrival."""
    entries = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source} line {n}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not JSON: {e.msg}") from None
        if not isinstance(record, dict):
            raise TraceError(f"{where}: expected an object with {', '.join(TRACE_FIELDS)}")
        missing = [k for k in TRACE_FIELDS if k not in record]
        if missing:
            raise TraceError(f"{where}: missing {', '.join(missing)}")
        arrival = record["arrival"]
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not (math.isfinite(arrival)
                                                                                      and arrival >= 0):
            raise TraceError(f"{where}: arrival must be a number of seconds >= 0, got {arrival!r}")
        for key in ("input_len", "output_len"):
            value = record[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TraceError(f"{where}: {key} must be an integer >= 1, got {value!r}")
        entries.append(TraceEntry(float(arrival), record["input_len"], record["output_len"]))
    if not entries:
        raise TraceError(f"{source}: no requests")
    return sorted(entries, key=lambda e: e.arrival)


def parse_csv_trace(lines: Iterable[str], source: str = "trace") -> list[TraceEntry]:
    """Azure's public LLM inference traces (`TIMESTAMP,ContextTokens,GeneratedTokens`, e.g. the code and
    conversation traces of the Splitwise paper), arrivals in seconds of the POSIX clock (UTC). Sorted by arrival."""
    entries = []
    for n, line in enumerate(lines, 1):
        if n == 1 or not line.strip():
            continue
        where = f"{source} line {n}"
        stamp, *counts = [field.strip() for field in line.split(",")]
        if len(counts) != 2:
            raise TraceError(f"{where}: expected {CSV_HEADER}, got {line.strip()!r}")
        try:
            arrival = csv_timestamp(stamp)
        except ValueError:
            raise TraceError(f"{where}: TIMESTAMP must be YYYY-MM-DD HH:MM:SS[.fraction], got {stamp!r}") from None
        lengths = []
        for key, value in zip(CSV_HEADER.split(",")[1:], counts):
            if not value.isdigit() or int(value) < 1:
                raise TraceError(f"{where}: {key} must be an integer >= 1, got {value!r}")
            lengths.append(int(value))
        entries.append(TraceEntry(arrival, *lengths))
    if not entries:
        raise TraceError(f"{source}: no requests")
    return sorted(entries, key=lambda e: e.arrival)


def csv_timestamp(text: str) -> float:
    """`2023-11-16 18:17:03.9799600` (any number of fraction digits; UTC) -> POSIX seconds."""
    whole, _, fraction = text.partition(".")
    if fraction and not fraction.isdigit():
        raise ValueError(text)
    t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return t + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def read_trace(path: str | Path, start: float = 0.0) -> list[TraceEntry]:
    """A trace file, or several joined by commas, merged in arrival order. A file is the bench's JSON lines, or a
    CSV in the schema of Azure's public LLM inference traces (recognised by its header). CSV files share one clock
    (their timestamps): the code and conversation traces of one hour merge into one mix over the span they both
    cover. JSON lines have no common origin, so they are not mixed with CSV. `start`: the requests from that many
    seconds after the first one on."""
    files, kinds = [], set()
    for one in str(path).split(","):
        try:
            lines = Path(one).read_text().splitlines()
        except OSError as e:
            raise TraceError(f"trace {one!r}: cannot read: {e.strerror}") from None
        csv = bool(lines) and lines[0].strip() == CSV_HEADER
        kinds.add(csv)
        files.append(parse_csv_trace(lines, one) if csv else parse_trace(lines, source=one))
    if len(kinds) > 1:
        raise TraceError(f"trace {str(path)!r}: JSON-lines and CSV traces have no common clock; give one kind")
    if len(files) > 1 and kinds == {True}:  # the span every file covers, so that the first requests are a mix
        first, last = max(f[0].arrival for f in files), min(f[-1].arrival for f in files)
        files = [[e for e in f if first <= e.arrival <= last] for f in files]
    entries = sorted((e for f in files for e in f), key=lambda e: e.arrival)
    if not entries:
        raise TraceError(f"trace {str(path)!r}: its files share no span of time")
    kept = [e for e in entries if e.arrival >= entries[0].arrival + start]
    if not kept:
        raise TraceError(f"trace {str(path)!r}: nothing {start:g} s in (it spans "
                         f"{entries[-1].arrival - entries[0].arrival:.0f} s)")
    return kept


def trace_requests(rng: random.Random, entries: list[TraceEntry], vocab_size: int,
                   ids: bool = True) -> list[BenchRequest]:
    """The trace's requests with random prompts (`ids`: random_prompt's); arrivals start at 0."""
    t0 = entries[0].arrival
    return [BenchRequest(random_prompt(rng, e.input_len, vocab_size, ids), e.output_len, e.arrival - t0)
            for e in entries]


def trace_rate(arrivals: list[float]) -> float:
    """The mean arrival rate of a trace (requests/s); inf when every request arrives at once."""
    span = max(arrivals) - min(arrivals)
    return (len(arrivals) - 1) / span if span > 0 else math.inf


def scale_arrivals(arrivals: list[float], rate: float) -> list[float]:
    """The same arrival pattern, stretched or squeezed to a mean of `rate` requests/s."""
    current = trace_rate(arrivals)
    if math.isinf(rate) or math.isinf(current):
        return [0.0] * len(arrivals)
    t0 = min(arrivals)
    return [(a - t0) * current / rate for a in arrivals]


# ---- arrivals -----------------------------------------------------------------------------------
ARRIVALS = ("poisson", "gamma")


def gamma_arrivals(rng: random.Random, n: int, rate: float, cv: float) -> list[float]:
    """Arrival times whose gaps are gamma-distributed with mean 1 / `rate` and coefficient of variation `cv`
    (shape 1 / cv^2): cv 1 is Poisson, above 1 bursty (clumps of arrivals and long lulls), below 1 steadier;
    inf: all at 0."""
    if math.isinf(rate):
        return [0.0] * n
    shape = 1.0 / (cv * cv)
    t, times = 0.0, []
    for _ in range(n):
        t += rng.gammavariate(shape, 1.0 / (rate * shape))
        times.append(t)
    return times


def poisson_arrivals(rng: random.Random, n: int, rate: float) -> list[float]:
    """Arrival times of a Poisson process of `rate` requests/s (exponential gaps); inf: all at 0."""
    if math.isinf(rate):
        return [0.0] * n
    t, times = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        times.append(t)
    return times
