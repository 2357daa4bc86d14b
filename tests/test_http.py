"""The OpenAI-compatible HTTP front end (`serve --http`) driven by the official `openai` package, raw HTTP and NVIDIA's
aiperf, against a CPU cluster in both modes; and its refusals in-process, without workers."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from common.auth import AuthError
from common.engine.llm import LLM
from common.prompt import load_tokenizer
from common.sampling_params import SamplingParams
from tests.cluster_harness import RunningCluster, free_port

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,"]
MAX_TOKENS = 16
GREEDY = dict(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
EXTRA = {"ignore_eos": True, "return_token_ids": True}
# A decode worker (and a prefill worker) takes 4 requests at a time and 2 more wait at the router: a burst of 16
# long requests is refused in part (the overload test); the other tests send fewer at a time.
LIMITS = ("--max-worker-requests", "4", "--max-queued-requests", "2")


class Served:
    def __init__(self, cluster: RunningCluster, port: int, model: str, mode: str):
        self.cluster, self.model, self.mode = cluster, model, mode
        self.url = f"http://127.0.0.1:{port}"

    def sync(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def aio(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def post(self, path: str, body: dict) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=120)

    def metrics(self) -> dict[tuple[str, tuple], float]:
        """Every sample of /metrics, parsed by prometheus-client's own parser: (name, sorted labels) -> value."""
        text = httpx.get(self.url + "/metrics", timeout=30).text
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def settled_metrics(self) -> dict[tuple[str, tuple], float]:
        """/metrics once the workers' heartbeats (every 0.5 s) report the same handoff totals twice in a row."""
        key = ("pdcluster_kv_handoffs_total", (("transport", "host"),))
        last = self.metrics()
        for _ in range(30):
            time.sleep(0.6)
            now = self.metrics()
            if now.get(key) == last.get(key):
                return now
            last = now
        return last

    def wait_clean(self) -> None:
        stats = self.cluster.wait_clean()
        assert stats.requests_in_flight == 0 and stats.queued_requests == 0
        assert all(w.alive and w.kv_blocks_free == w.kv_blocks_total for w in stats.workers), stats.workers


@pytest.fixture(scope="module", params=["disagg", "colocated"])
def served(request, tiny_qwen3_dir, tmp_path_factory):
    port = free_port()
    cluster = RunningCluster(tiny_qwen3_dir, request.param, tmp_path_factory.mktemp("http") / "serve.log",
                             "--http", f"127.0.0.1:{port}", *LIMITS)
    yield Served(cluster, port, str(tiny_qwen3_dir), request.param)
    cluster.stop_cleanly()


@pytest.fixture(scope="module")
def expected(tiny_qwen3_dir):
    """What the offline engine (`pdcluster generate`, and `--chat`) answers: {chat: [(token ids, text)]}."""
    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20)
    try:
        return {chat: [(o.token_ids, o.text) for o in llm.generate(PROMPTS, SamplingParams(**GREEDY), chat=chat,
                                                                   use_tqdm=False)]
                for chat in (False, True)}
    finally:
        llm.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir):
    return load_tokenizer(str(tiny_qwen3_dir))


# --- results equal the offline engine's ------------------------------------------------------------------------


def test_completions_equal_generate_with_exact_usage(served, expected, tokenizer):
    client = served.sync()
    for prompt, (ids, text) in zip(PROMPTS, expected[False]):
        out = client.completions.create(model=served.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                        extra_body=EXTRA)
        choice = out.choices[0]
        assert (choice.text, choice.model_extra["token_ids"]) == (text, ids)
        assert choice.finish_reason == "length" and out.model == served.model and out.id and out.created > 0
        assert out.usage.prompt_tokens == len(tokenizer.encode(prompt))
        assert out.usage.completion_tokens == MAX_TOKENS
        assert out.usage.total_tokens == out.usage.prompt_tokens + MAX_TOKENS


def test_token_id_prompts_equal_text_prompts(served, expected, tokenizer):
    ids, text = expected[False][0]
    out = served.sync().completions.create(model=served.model, prompt=tokenizer.encode(PROMPTS[0]),
                                           max_tokens=MAX_TOKENS, temperature=0, extra_body=EXTRA)
    assert (out.choices[0].text, out.choices[0].model_extra["token_ids"]) == (text, ids)


def test_chat_equals_generate_chat(served, expected, tokenizer):
    client = served.sync()
    for prompt, (ids, text) in zip(PROMPTS, expected[True]):
        out = client.chat.completions.create(model=served.model, messages=[{"role": "user", "content": prompt}],
                                             max_completion_tokens=MAX_TOKENS, temperature=0, extra_body=EXTRA)
        choice = out.choices[0]
        assert (choice.message.content, choice.model_extra["token_ids"]) == (text, ids)
        assert choice.message.role == "assistant" and choice.finish_reason == "length"
        templated = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                  add_generation_prompt=True)
        assert out.usage.prompt_tokens == len(tokenizer.encode(templated, add_special_tokens=False))
        assert out.usage.completion_tokens == MAX_TOKENS


def test_async_streams_join_to_the_whole_completion_and_end_with_usage(served, expected):
    async def completion(client: openai.AsyncOpenAI, i: int) -> tuple[str, list[int], str, object]:
        stream = await client.completions.create(model=served.model, prompt=PROMPTS[i], max_tokens=MAX_TOKENS,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}, extra_body=EXTRA)
        text, ids, finish, usage = "", [], None, None
        async for chunk in stream:
            for c in chunk.choices:
                text += c.text
                ids += c.model_extra.get("token_ids") or []
                finish = c.finish_reason or finish
            usage = chunk.usage or usage
        return text, ids, finish, usage

    async def chat(client: openai.AsyncOpenAI, i: int) -> tuple[str, list[int], str, object]:
        stream = await client.chat.completions.create(
            model=served.model, messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=MAX_TOKENS,
            temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=EXTRA)
        text, ids, finish, usage = "", [], None, None
        async for chunk in stream:
            for c in chunk.choices:
                text += c.delta.content or ""
                ids += c.model_extra.get("token_ids") or []
                finish = c.finish_reason or finish
            usage = chunk.usage or usage
        return text, ids, finish, usage

    async def main():
        async with served.aio() as client:
            return await asyncio.gather(*[completion(client, i) for i in range(len(PROMPTS))],
                                        *[chat(client, i) for i in range(len(PROMPTS))])

    results = asyncio.run(main())
    for (text, ids, finish, usage), (want_ids, want_text) in zip(results, expected[False] + expected[True]):
        assert (text, ids) == (want_text, want_ids)
        assert finish == "length" and usage.completion_tokens == MAX_TOKENS


def test_sse_ends_with_done(served):
    with httpx.stream("POST", served.url + "/v1/completions", timeout=120, json={
            "model": served.model, "prompt": PROMPTS[0], "max_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


# --- stop strings and stop tokens -------------------------------------------------------------------------------


def _a_stop_string(text: str) -> str:
    """Three printable ASCII characters from the middle of `text` (a random model's text has odd characters)."""
    for i in range(3, len(text) - 3):
        piece = text[i:i + 3]
        if piece.isascii() and piece.isprintable():
            return piece
    pytest.skip(f"no ASCII run in {text!r}")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_end_the_text_before_them_and_count_every_token(served, expected, tokenizer, stream):
    ids, text = expected[False][1]
    stop = _a_stop_string(text)
    # the completion ends at the token that completes the stop string; its text just before the stop string
    kept = next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k], skip_special_tokens=True))
    body = {"model": served.model, "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS, "temperature": 0,
            "stop": ["never appears \x00", stop], "extra_body": EXTRA}
    client = served.sync()
    if stream:
        got_text, got_ids, finish, usage = "", [], None, None
        for chunk in client.completions.create(**body, stream=True, stream_options={"include_usage": True}):
            for c in chunk.choices:
                got_text, got_ids = got_text + c.text, got_ids + (c.model_extra.get("token_ids") or [])
                finish = c.finish_reason or finish
            usage = chunk.usage or usage
    else:
        out = client.completions.create(**body)
        got_text, got_ids = out.choices[0].text, out.choices[0].model_extra["token_ids"]
        finish, usage = out.choices[0].finish_reason, out.usage
    assert got_text == text[:text.index(stop)] and finish == "stop"
    assert got_ids == ids[:kept] and usage.completion_tokens == kept
    served.wait_clean()  # the workers were told to stop generating it


def test_stop_token_ids_end_the_completion_with_that_token(served, expected):
    ids, _ = expected[False][0]
    stop_at = 5
    out = served.post("/v1/completions", {"model": served.model, "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS,
                                          "temperature": 0, "stop_token_ids": [ids[stop_at]], **EXTRA}).json()
    first = ids.index(ids[stop_at])
    assert out["choices"][0]["token_ids"] == ids[:first + 1] and out["choices"][0]["finish_reason"] == "stop"


# --- errors -----------------------------------------------------------------------------------------------------

BAD = [
    ("/v1/completions", {"n": 2}, "n"),
    ("/v1/completions", {"logprobs": 1}, "logprobs"),
    ("/v1/completions", {"echo": True}, "echo"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"max_tokens": "many"}, "max_tokens"),
    ("/v1/completions", {"temperature": -1}, "temperature"),
    ("/v1/completions", {"top_p": 1.5}, "top_p"),
    ("/v1/completions", {"top_k": -3}, "top_k"),
    ("/v1/completions", {"seed": -1}, "seed"),
    ("/v1/completions", {"stop": ["x"] * 17}, "stop"),
    ("/v1/completions", {"stop": [""]}, "stop"),
    ("/v1/completions", {"stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/completions", {"ignore_eos": "yes"}, "ignore_eos"),
    ("/v1/completions", {"stream_options": {"include_usage": 3}}, "stream_options.include_usage"),
    ("/v1/completions", {"presence_penalty": 0.5}, "presence_penalty"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 10**8]}, "prompt"),
    ("/v1/completions", {"prompt": "word " * 5000}, "prompt"),
    ("/v1/completions", {"prompt": None}, "prompt"),
    ("/v1/chat/completions", {"n": 3}, "n"),
    ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": None}, "messages"),
    ("/v1/completions", {"max_tokens": 10**30}, "max_tokens"),
    ("/v1/chat/completions", {"max_completion_tokens": -5}, "max_completion_tokens"),
    ("/v1/chat/completions", {"max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 5000}]}, "messages"),
]


def test_each_bad_parameter_gets_a_400_naming_it(served):
    base = {"/v1/completions": {"model": served.model, "prompt": "hello", "max_tokens": 4},
            "/v1/chat/completions": {"model": served.model, "messages": [{"role": "user", "content": "hi"}],
                                     "max_tokens": 4}}
    for path, fields, param in BAD:
        r = served.post(path, {**base[path], **fields})
        err = r.json()["error"]
        assert (r.status_code, err["param"]) == (400, param), (path, fields, r.text)
        assert err["message"] and err["type"] == "invalid_request_error"
    r = httpx.post(served.url + "/v1/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:  # as the official client sees one
        served.sync().completions.create(model=served.model, prompt="hi", n=2)
    assert e.value.status_code == 400 and "n" in e.value.message
    assert served.sync().completions.create(model=served.model, prompt="hi", max_tokens=2).choices[0].text is not None


def test_unknown_model_is_404(served):
    with pytest.raises(openai.NotFoundError) as e:
        served.sync().completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert e.value.status_code == 404 and e.value.body["param"] == "model"


def test_overload_gets_429_with_retry_after_and_the_cluster_recovers(served):
    async def one(client: httpx.AsyncClient) -> tuple[int, str | None]:
        async with client.stream("POST", "/v1/completions", json={
                "model": served.model, "prompt": PROMPTS[0], "max_tokens": 400, "ignore_eos": True,
                "stream": True}) as r:
            async for _ in r.aiter_lines():
                pass
            return r.status_code, r.headers.get("retry-after")

    async def burst():
        async with httpx.AsyncClient(base_url=served.url, timeout=300) as client:
            return await asyncio.gather(*[one(client) for _ in range(16)])

    answers = asyncio.run(burst())
    refused = [a for a in answers if a[0] == 429]
    assert refused and all(retry is not None and int(retry) >= 1 for _, retry in refused), answers
    assert all(status in (200, 429) for status, _ in answers), answers
    served.wait_clean()
    out = served.sync().completions.create(model=served.model, prompt=PROMPTS[0], max_tokens=4)
    assert out.choices[0].finish_reason == "length"


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_gone_mid_request_aborts_it_and_every_block_is_freed(served, stream):
    aborted = ("pdcluster_request_success_total", (("finished_reason", "abort"),))
    before = served.metrics().get(aborted, 0.0)
    body = {"model": served.model, "prompt": PROMPTS[0] * 20, "max_tokens": 2000, "ignore_eos": True,
            "stream": stream}
    if stream:
        with httpx.stream("POST", served.url + "/v1/completions", timeout=120, json=body) as r:
            lines = r.iter_lines()
            assert [next(lines) for _ in range(6)]  # a few tokens came: it runs on the workers
    else:  # a client that stops waiting for the whole completion (2000 tokens take longer on CPU)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(served.url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    served.wait_clean()
    assert served.metrics()[aborted] == before + 1  # ended by the abort, not by max_tokens


def test_health_and_models(served):
    assert httpx.get(served.url + "/health", timeout=30).status_code == 200
    models = served.sync().models.list()
    assert [m.id for m in models.data] == [served.model]


# --- metrics ----------------------------------------------------------------------------------------------------


def test_metrics_parse_and_count_the_requests_sent(served, expected):
    served.wait_clean()
    before = served.settled_metrics()
    client = served.sync()
    outs = [client.completions.create(model=served.model, prompt=p, max_tokens=MAX_TOKENS, temperature=0,
                                      extra_body=EXTRA) for p in PROMPTS]
    stop = _a_stop_string(expected[False][1][1])
    stopped = client.completions.create(model=served.model, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0,
                                        stop=[stop])
    long_prompt = " ".join(PROMPTS) * 4  # several KV blocks: the second time, the prefix cache has them
    repeated = [client.completions.create(model=served.model, prompt=long_prompt, max_tokens=2, temperature=0,
                                          extra_body=EXTRA) for _ in range(2)]
    assert repeated[1].usage.prompt_tokens_details.cached_tokens > 0
    assert served.post("/v1/completions", {"model": served.model, "prompt": "x", "top_p": 7}).status_code == 400
    served.wait_clean()
    after = served.settled_metrics()

    def delta(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("pdcluster_request_success_total", finished_reason="length") == len(PROMPTS) + 2
    assert delta("pdcluster_request_success_total", finished_reason="stop") == 1
    assert delta("pdcluster_request_failure_total", code="bad_request") == 1
    completions = outs + [stopped] + repeated
    assert delta("pdcluster_generation_tokens_total") == sum(o.usage.completion_tokens for o in completions)
    assert delta("pdcluster_prompt_tokens_total") == sum(o.usage.prompt_tokens for o in completions)
    assert delta("pdcluster_prefix_cache_queries_total") == sum(o.usage.prompt_tokens for o in completions)
    assert delta("pdcluster_prefix_cache_hits_total") == sum(o.usage.prompt_tokens_details.cached_tokens
                                                             for o in completions) > 0
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert delta(f"pdcluster_{histogram}_count") == len(completions)
    assert delta("pdcluster_inter_token_latency_seconds_count") == sum(o.usage.completion_tokens - 1
                                                                       for o in completions)
    assert after[("pdcluster_num_requests_running", ())] == 0 and after[("pdcluster_num_requests_waiting", ())] == 0
    workers = {dict(labels)["worker"]: value for (name, labels), value in after.items()
               if name == "pdcluster_worker_up"}
    assert sorted(workers) == (["d0", "p0"] if served.mode == "disagg" else ["c0"]) and set(workers.values()) == {1}
    if served.mode != "disagg":
        assert not any(name.startswith(("pdcluster_kv_links", "pdcluster_prefills")) for name, _ in after)
    for worker in workers:
        role = {"d": "decode", "p": "prefill", "c": "colocated"}[worker[0]]
        labels = (("role", role), ("worker", worker))
        assert after[("pdcluster_kv_cache_blocks_used", labels)] == 0
        assert after[("pdcluster_kv_cache_blocks_free", labels)] > 0
    if served.mode == "disagg":  # every prompt's KV went from p0 to d0 over the host transport
        assert after[("pdcluster_kv_links_opened_total", ())] == 1 and after[("pdcluster_kv_links_opening", ())] == 0
        assert delta("pdcluster_prefills_total", where="remote") == len(completions)  # (the bad request is not one)
        assert delta("pdcluster_prefills_total", where="local") == 0
        assert delta("pdcluster_kv_handoffs_total", transport="host") == len(completions)
        assert delta("pdcluster_kv_handoff_bytes_total", transport="host") > 0
        assert delta("pdcluster_kv_handoff_seconds_total", transport="host") > 0


# --- a load tool nobody here wrote ------------------------------------------------------------------------------

@pytest.mark.slow
def test_aiperf_runs_against_the_http_front_end_without_errors(served, aiperf, tmp_path):
    endpoint = "completions" if served.mode == "disagg" else "chat"
    requests = 12
    proc = subprocess.run(
        [str(aiperf), "profile", "--model", served.model, "--url", served.url, "--endpoint-type", endpoint,
         "--streaming", "--request-count", str(requests), "--concurrency", "2", "--isl", "32", "--osl", "16",
         "--extra-inputs", "ignore_eos:true", "--tokenizer", served.model, "--use-server-token-count",
         "--random-seed", "0", "--ui", "none", "--artifact-dir", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_COLOR": "1", "AIPERF_DATASET_MMAP_BASE_PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert summary["request_count"]["avg"] == requests and not summary["error_summary"], summary["error_summary"]
    assert summary["is_complete"] and not summary["was_cancelled"]
    assert summary["output_sequence_length"]["avg"] == 16  # the server's usage: ignore_eos honoured
    served.wait_clean()


# --- in-process, without workers: auth, and the answers of a cluster that cannot serve yet ------------------------


@pytest.fixture
def no_workers(tiny_qwen3_dir, tmp_path):
    """A router with a shared secret and no workers, its HTTP app called in-process."""
    from router.config import RouterConfig
    from router.http.app import FrontEnd
    from router.router import Router

    secret = tmp_path / "secret"
    secret.write_text("s3cret-s3cret-s3cret\n")
    router = Router(RouterConfig(model=str(tiny_qwen3_dir), bind=f"tcp://127.0.0.1:{free_port()}",
                                 auth_token_file=str(secret), served_model_name="tiny"))
    yield httpx.ASGITransport(app=FrontEnd(router).app)
    router.close()


def _call(transport, method: str, path: str, body: dict | None = None, key: str | None = None) -> httpx.Response:
    async def go():
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, json=body, headers=headers)
    return asyncio.run(go())


def test_with_a_shared_secret_every_api_call_needs_it_as_a_bearer_key(no_workers):
    body = {"model": "tiny", "prompt": "hi"}
    for key in (None, "wrong-wrong-wrong-wrong"):
        for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                             ("GET", "/metrics")):
            r = _call(no_workers, method, path, body, key)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    assert _call(no_workers, "GET", "/v1/models", key="s3cret-s3cret-s3cret").status_code == 200


def test_without_workers_requests_get_503_with_retry_after_and_health_says_not_ready(no_workers):
    r = _call(no_workers, "POST", "/v1/completions", {"model": "tiny", "prompt": "hi"}, "s3cret-s3cret-s3cret")
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1 and r.json()["error"]["code"] == "unavailable"
    assert _call(no_workers, "GET", "/health").status_code == 503
    r = _call(no_workers, "POST", "/v1/completions", {"model": "other", "prompt": "hi"}, "s3cret-s3cret-s3cret")
    assert r.status_code == 404


def test_a_non_loopback_http_bind_needs_the_shared_secret(tiny_qwen3_dir, monkeypatch):
    from router.config import RouterConfig
    from router.router import Router

    monkeypatch.delenv("PDCLUSTER_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("PDCLUSTER_AUTH_TOKEN_FILE", raising=False)
    with pytest.raises(AuthError, match="0.0.0.0"):
        Router(RouterConfig(model=str(tiny_qwen3_dir), bind=f"tcp://127.0.0.1:{free_port()}", http="0.0.0.0:8000"))
    with pytest.raises(ValueError, match="http: must be HOST:PORT"):
        RouterConfig(model=str(tiny_qwen3_dir), http="localhost").check()


def test_the_front_end_benchmark_runs(tiny_qwen3_dir):
    """scripts/bench_frontend.py end to end, tiny (its figures are docs/benchmarks.md's, not asserted here)."""
    proc = subprocess.run([sys.executable, "-m", "scripts.bench_frontend", "--model", str(tiny_qwen3_dir),
                           "--requests", "40", "--concurrency", "1,4", "--clients", "1", "--router-core", "-1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("zmq", "1"), ("http", "1"), ("zmq", "4"), ("http", "4")]


def test_the_front_end_benchmark_times_first_tokens_of_long_prompts(tiny_qwen3_dir):
    """--prompt-tokens N --stream: a prompt of N tokens (text through HTTP, ids through ZMQ), timed to the first
    streamed token; both paths answer and the rows carry TTFTs."""
    proc = subprocess.run([sys.executable, "-m", "scripts.bench_frontend", "--model", str(tiny_qwen3_dir),
                           "--requests", "30", "--concurrency", "1", "--clients", "1", "--router-core", "-1",
                           "--prompt-tokens", "256", "--stream"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "TTFT p50 ms" in lines[0]
    rows = [line.split() for line in lines[1:]]
    assert [r[0] for r in rows] == ["zmq", "http"] and all(0 < float(r[2]) <= float(r[3]) for r in rows)


def test_long_prompts_carry_the_same_tokens_as_text_and_as_ids(tiny_qwen3_dir):
    from common.prompt import load_tokenizer
    from scripts.bench_frontend import prompts

    text, ids = prompts(str(tiny_qwen3_dir), 100)
    assert load_tokenizer(str(tiny_qwen3_dir)).encode(text, add_special_tokens=False) == ids
    assert abs(len(ids) - 100) <= 5
