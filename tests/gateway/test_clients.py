"""The three client libraries apps use, unchanged, against `edge gateway` in front of a real
runtime (MiniLM, ONNX Runtime): the official `openai` package, LangChain's OpenAIEmbeddings and
huggingface_hub's InferenceClient.feature_extraction (TEI's API). Each gets the embeddings
`edge embed` gives for the same texts (cos >= 0.9999), and the runtime's overload, invalid
input and not-ready reach each as the error its library raises.

The runtime runs with a test-only engine delay (300 ms a batch), so that a burst of 16
connections x 64 texts holds its queue full for seconds: long enough for the clients'
requests to meet OVERLOADED on a state the test has seen, not on timing luck.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import huggingface_hub
import langchain_openai
import numpy as np
import openai
import pytest
import zmq
from huggingface_hub.errors import HfHubHTTPError  # a submodule: not an attribute until imported

from edge.ipc import protocol as P
from edge.ipc.client import EdgeClient
from support.gateway_proc import start_gateway
from support.runtime_proc import running_runtime, runtime_address, start_runtime

# In the test extra, pinned: a missing one is an install error, never a skip.
pytestmark = pytest.mark.process

TEXTS = ["The conveyor belt stopped at 14:02.", "Replace the filter every 500 hours.", "hello world",
         "Der Sensor meldet eine Übertemperatur.", "a" * 40]
MODEL = "all-MiniLM-L6-v2"
ENGINE_DELAY_MS = 300


@pytest.fixture(scope="module")
def runtime(minilm_package, tmp_path_factory):
    with running_runtime(tmp_path_factory.mktemp("gw-rt"), "--package", str(minilm_package), "--engine",
                       "onnxruntime", "--fallback", "off", "--fault-engine-delay-ms", str(ENGINE_DELAY_MS)) as rt:
        yield rt


@pytest.fixture(scope="module")
def gateway(runtime, tmp_path_factory):
    gw = start_gateway(tmp_path_factory.mktemp("gw"), runtime.address)
    try:
        yield gw
    finally:
        assert gw.stop() == 0, gw.output()


@pytest.fixture(scope="module")
def reference(runtime):
    """`edge embed` for TEXTS: the runtime's own answer, through its own command."""
    out = subprocess.run([sys.executable, "-m", "edge.cli", "embed", *TEXTS, "--connect", runtime.address,
                          "--timeout", "30"], capture_output=True, text=True, timeout=60, check=True).stdout
    return np.array([json.loads(line)["embedding"] for line in out.splitlines()], dtype=np.float32)


def assert_same(got, want) -> None:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999, cos


def openai_client(gw):
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_openai_embeddings_create(gateway, reference):
    client = openai_client(gateway)
    res = client.embeddings.create(model=MODEL, input=TEXTS)  # the package's default: base64
    assert_same([d.embedding for d in res.data], reference)
    assert res.usage.prompt_tokens > len(TEXTS) and res.model == MODEL
    one = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    assert_same([one.data[0].embedding], reference[:1])
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=128)
    assert [m.id for m in client.models.list()] == [MODEL]


def test_langchain_openai_embeddings(gateway, reference):
    emb = langchain_openai.OpenAIEmbeddings(model=MODEL, base_url=gateway.url + "/v1", api_key="unused",
                                            check_embedding_ctx_length=False, max_retries=0)
    assert_same(emb.embed_documents(TEXTS), reference)
    assert_same([emb.embed_query(TEXTS[2])], reference[2:3])


def test_huggingface_hub_feature_extraction(gateway, reference):
    client = huggingface_hub.InferenceClient(model=gateway.url + "/embed")
    for i, text in enumerate(TEXTS):
        assert_same(client.feature_extraction(text), reference[i:i + 1])
    base = huggingface_hub.InferenceClient(model=gateway.url)  # TEI's "/" route too
    assert_same(base.feature_extraction(TEXTS[0], normalize=True, truncate=True), reference[:1])


def test_more_inputs_than_one_runtime_request_holds(gateway, reference):
    """200 inputs: four runtime requests of at most 64, answered in order."""
    texts = [TEXTS[i % len(TEXTS)] for i in range(200)]
    res = openai_client(gateway).embeddings.create(model=MODEL, input=texts)
    assert_same([d.embedding for d in res.data], reference[[i % len(TEXTS) for i in range(200)]])
    assert [d.index for d in res.data] == list(range(200))


def test_invalid_input_is_each_librarys_error(gateway):
    with pytest.raises(openai.BadRequestError) as exc:
        openai_client(gateway).embeddings.create(model=MODEL, input="")
    assert exc.value.status_code == 400 and exc.value.response.headers["X-Trace-Id"]
    assert exc.value.body["code"] == "empty_text" and exc.value.body["trace_id"]
    with pytest.raises(openai.BadRequestError, match="TEXT_TOO_LONG|32768"):
        langchain_openai.OpenAIEmbeddings(model=MODEL, base_url=gateway.url + "/v1", api_key="unused",
                                          check_embedding_ctx_length=False, max_retries=0
                                          ).embed_documents(["x " * 20000])
    client = huggingface_hub.InferenceClient(model=gateway.url + "/embed")
    with pytest.raises(HfHubHTTPError) as hf:
        client.feature_extraction("   ")
    assert hf.value.response.status_code == 400
    with pytest.raises(HfHubHTTPError) as hf:
        client.feature_extraction("maintenance window " * 200)  # TEI refuses over-long inputs unless truncate
    assert hf.value.response.status_code == 422 and hf.value.response.json()["error_type"] == "Validation"


def _queue_texts(address: str) -> int:
    with EdgeClient(address, timeout_s=5) as c:
        return c.health()["queue"]["texts"]


def _wait(cond, timeout_s: float, what: str) -> None:
    t_end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < t_end, what
        time.sleep(0.05)


def test_overload_is_each_librarys_error(gateway, runtime):
    """16 connections x 64 texts fill the runtime's 1,024 texts; the clients' requests meet OVERLOADED."""
    ctx = zmq.Context()
    socks = []
    try:
        for _ in range(16):
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(runtime.address)
            socks.append(s)
        for i, s in enumerate(socks):
            s.send_multipart(P.encode_request("infer", {"texts": [f"flood {i} {j}" for j in range(64)]}))
        _wait(lambda: _queue_texts(runtime.address) >= 1024, 20, "the flood never filled the queue")
        with pytest.raises(openai.RateLimitError) as exc:
            openai_client(gateway).embeddings.create(model=MODEL, input="one more")
        assert exc.value.response.headers["Retry-After"] == "1" and exc.value.body["code"] == "overloaded"
        with pytest.raises(openai.RateLimitError):
            langchain_openai.OpenAIEmbeddings(model=MODEL, base_url=gateway.url + "/v1", api_key="unused",
                                              check_embedding_ctx_length=False, max_retries=0).embed_query("x")
        with pytest.raises(HfHubHTTPError) as hf:
            huggingface_hub.InferenceClient(model=gateway.url + "/embed").feature_extraction("one more")
        assert hf.value.response.status_code == 429 and hf.value.response.json()["error_type"] == "Overloaded"
        assert _queue_texts(runtime.address) >= 1024 - 64, "the queue drained before the clients were refused"
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    _wait(lambda: _queue_texts(runtime.address) == 0, 60, "the flood never drained")


def test_not_ready_is_each_librarys_error(tmp_path):
    """A gateway whose runtime is not there: /health 503, and 503 to each client library."""
    gw = start_gateway(tmp_path, f"ipc://{tmp_path}/nobody.sock")
    try:
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(gw.url + "/health", timeout=10)
        assert health.value.code == 503
        with pytest.raises(openai.InternalServerError) as exc:
            openai_client(gw).embeddings.create(model=MODEL, input="hello")
        assert exc.value.status_code == 503 and exc.value.body["code"] == "not_ready"
        with pytest.raises(openai.InternalServerError):
            langchain_openai.OpenAIEmbeddings(model=MODEL, base_url=gw.url + "/v1", api_key="unused",
                                              check_embedding_ctx_length=False, max_retries=0).embed_query("x")
        with pytest.raises(HfHubHTTPError) as hf:
            huggingface_hub.InferenceClient(model=gw.url + "/embed").feature_extraction("hello")
        assert hf.value.response.status_code == 503
    finally:
        assert gw.stop() == 0, gw.output()


def test_a_gateway_up_before_its_runtime_serves_once_the_runtime_is_ready(minilm_package, tmp_path):
    """The gateway first (as after a boot where it starts before a slow runtime), then the runtime:
    /health is 503 until the runtime's READY, and the requests right after it are served, not
    refused while the gateway's connections are still being made (ZeroMQ retries a connect every
    100-200 ms)."""
    import urllib.error
    import urllib.request

    workdir = tmp_path / "rt"
    gw = start_gateway(tmp_path / "gw", runtime_address(workdir))
    rt = None
    try:
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(gw.url + "/health", timeout=10)
        assert health.value.code == 503
        rt = start_runtime(workdir, "--package", str(minilm_package), "--engine", "onnxruntime", "--fallback", "off")
        rt.wait_ready()
        with urllib.request.urlopen(gw.url + "/health", timeout=10) as r:
            assert r.status == 200
        res = openai_client(gw).embeddings.create(model=MODEL, input=TEXTS[:2])
        assert [len(d.embedding) for d in res.data] == [384, 384]
    finally:
        assert gw.stop() == 0, gw.output()
        if rt is not None:
            rt.stop()


def test_health_is_503_when_the_runtime_does_not_answer(tmp_path):
    """A peer that takes the health request and never replies (a hung runtime, or one killed with
    the request in flight): /health is 503 once its 1 s is up, not 504, as for any runtime that is
    not ready (a load balancer or probe reads only 200 and 503)."""
    import urllib.error
    import urllib.request

    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(f"ipc://{tmp_path}/silent.sock")
    gw = start_gateway(tmp_path / "gw", f"ipc://{tmp_path}/silent.sock")
    try:
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(gw.url + "/health", timeout=10)
        body = json.loads(health.value.read())
        assert health.value.code == 503 and body["error_type"] == "Unhealthy", body
        assert "did not answer" in body["error"] and body["trace_id"] == health.value.headers["X-Trace-Id"], body
        assert silent.poll(0), "the request never reached the silent peer"
    finally:
        assert gw.stop() == 0, gw.output()
        silent.close(0)
        ctx.term()


def test_health_is_200_once_the_runtime_is_ready(gateway):
    import urllib.request

    with urllib.request.urlopen(gateway.url + "/health", timeout=10) as r:
        assert r.status == 200 and r.headers["X-Trace-Id"]
    with urllib.request.urlopen(gateway.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "edge_gateway_requests_total" in text and "edge_gateway_texts_total" in text
