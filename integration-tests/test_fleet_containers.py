"""Three replicas of the image behind nginx on a user-defined docker network (issue 46 item 5): with `hash …
consistent` on the affinity key the questions of one state are computed on one replica, where round-robin computes
the state on every replica (both in the same run); a replica stopped under load (`docker stop`) costs no client an
answer; a replica scaled down (SIGTERM) finishes the requests it accepted. nginx is the balancer
(integration-tests/fleet/: Debian's nginx on the image's local base, docs/deploy.md's recipe); only its port is
published, on 127.0.0.1, and each replica's /metrics is read through it.

The tests share one fleet and run in file order: the loss test stops decision-1, the scale-down drains decision-2,
and decision-0 serves to the end. DECISION_FLEET_REPORT=FILE writes their figures as JSON
(bench/results/2026-12-07-fleet).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import containers
import httpx2
import pytest
from conftest import HEALTH_TIMEOUT_S, TARGETS
from wire import affinity_key, show

import docker

pytestmark = pytest.mark.skipif("container" not in TARGETS, reason="DECISION_TEST_TARGETS leaves out the container")

FLEET_DIR = Path(__file__).resolve().parent / "fleet"
NGINX_IMAGE = os.environ.get("DECISION_TEST_NGINX_IMAGE", "decision-inference-nginx:test")
# The aliases nginx.conf names; decision-2 drains as deploy/base's pods do (30 s), the others keep the image's 8 s.
REPLICAS = ("decision-0", "decision-1", "decision-2")
SURVIVOR, LOST, DRAINED = REPLICAS
DRAIN_GRACE_S = 30
# Three replicas share this machine's cores: one compute thread each (as a pod's CPU limit would), so they do not
# spin against each other; eager layers and exact float32 GEMMs, since compiling the layers (`--compile auto`, into
# each container's own /data) took 129 s with three replicas starting together on 2 cores, and none of it is what
# this test is about. A 256 MiB prefix cache holds every state here (the default, 8 full-length prompts, is 1.1 GB a
# replica, all touched at warm-up).
REPLICA_ARGS = ["--threads", "1", "--compile", "off", "--matmul", "exact", "--prefix-cache-mb", "256"]
# Every HTTP call's limit: a call that needs it has hung.
CALL_TIMEOUT_S = 60.0
RETRY_STATUSES = {429, 503, 529}
MAX_ATTEMPTS = 6
FIGURES: dict[str, Any] = {}

STATE_TEXT = "The refund has not arrived, the invoice total is wrong and nobody answered my two emails. " * 12


def state_of(tag: str, i: int, text: str = STATE_TEXT) -> dict[str, str]:
    return {"ticket": f"Ticket {tag}-{i}: {text}"}


def nouls(*names: str) -> dict[str, Any]:
    return {name: {"type": "noul", "instructions": f"Does the ticket raise {name}?"} for name in names}


@dataclass
class Fleet:
    """The replicas (by alias), nginx in front of them, and which address is which replica."""

    nginx: containers.Container
    replicas: dict[str, containers.Container]
    names_by_address: dict[str, str]

    @property
    def url(self) -> str:
        return self.nginx.url

    def answered_by(self, response: httpx2.Response) -> list[str]:
        """The replicas nginx tried, in order (`x-upstream`: "ip:80, ip:80" when it moved on)."""
        tried = response.headers.get("x-upstream", "")
        return [self.names_by_address.get(a.strip(), a.strip()) for a in tried.split(",") if a.strip()]

    def series(self, name: str) -> dict[str, float]:
        """A replica's unlabelled series from its /metrics, read through nginx."""
        r = httpx2.get(f"{self.url}/replica/{name}/metrics", timeout=CALL_TIMEOUT_S)
        assert r.status_code == 200, show(r)
        return {m[1]: float(m[2]) for m in re.finditer(r"^(\w+) (\S+)$", r.text, re.MULTILINE)}

    def tokens(self) -> dict[str, tuple[float, float]]:
        """(computed, cached) prompt tokens of every live replica, as their /metrics count them."""
        out = {}
        for name in REPLICAS:
            if self.replicas[name].status() == "running":
                page = self.series(name)
                # (A counter appears at its first increment.)
                out[name] = (page.get("decision_computed_tokens_total", 0), page.get("decision_cached_tokens_total", 0))
        return out

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for name, replica in self.replicas.items():
            last = "no answer yet"
            while True:
                code = replica.exit_code()
                if code is not None:
                    raise AssertionError(f"{name} exited with {code} before /ready\n{replica.logs_tail()}")
                try:
                    r = httpx2.get(f"{self.url}/replica/{name}/ready", timeout=5.0)
                    if r.status_code == 200:
                        break
                    last = show(r, 300)
                except httpx2.HTTPError as e:
                    last = f"{type(e).__name__}: {e}"
                if time.monotonic() > deadline:
                    raise AssertionError(f"{name} not ready within {timeout_s:.0f} s ({last})\n{replica.logs_tail()}")
                time.sleep(0.5)

    def memory_mib(self) -> dict[str, float]:
        """Each replica's memory as `docker stats` shows it (usage less the page cache it could drop)."""
        out = {}
        for name, replica in self.replicas.items():
            memory = replica.wrapped.stats(stream=False, one_shot=True)["memory_stats"]
            cache = memory.get("stats", {}).get("inactive_file", memory.get("stats", {}).get("total_inactive_file", 0))
            out[name] = round((memory["usage"] - cache) / 2**20, 1)
        return out

    def nginx_log(self) -> list[str]:
        return [line for line in self.nginx.logs().splitlines() if " statuses=" in line]


def shutdown_lines(replica: containers.Container) -> list[str]:
    """The launcher's and router's lines about a shutdown, timestamped, for the figures."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", replica.logs())
    words = ("SIGTERM", "SIGKILL", "drain", "exited", "shutting", "stopped", "grace")
    return [line[:200] for line in plain.splitlines() if any(w in line for w in words) and "config=" not in line]


def states_by_holder(fleet: Fleet, tag: str, per_replica: int, text: str = STATE_TEXT) -> dict[str, list[Any]]:
    """`per_replica` states for each live replica whose affinity key the consistent hash sends there. nginx reads
    only the header, so a one-word probe carrying a state's key tells where the state goes, and no replica computes
    or caches the state itself."""
    found: dict[str, list[Any]] = {name: [] for name in REPLICAS if fleet.replicas[name].status() == "running"}
    with httpx2.Client(base_url=fleet.url, timeout=CALL_TIMEOUT_S) as client:
        for i in range(40 * per_replica):
            state = state_of(tag, i, text)
            body = {"state": "probe", "questions": nouls("probe")}
            r = client.post("/v1/systemone", json=body, headers={"x-decision-affinity": affinity_key(state)})
            assert r.status_code == 200, show(r)
            holder = fleet.answered_by(r)[-1]
            if len(found[holder]) < per_replica:
                found[holder].append(state)
            if all(len(states) == per_replica for states in found.values()):
                return found
    raise AssertionError(f"{40 * per_replica} keys did not give each replica {per_replica}: {found}")


@pytest.fixture(scope="session")
def nginx_image() -> str:
    """integration-tests/fleet/Dockerfile on the project image's local base, built once a session (a cached
    rebuild takes a second; the first one about 40 s: apt installs nginx)."""
    client = docker.from_env()
    try:
        client.images.get(containers.BASE_IMAGE)
    except docker.errors.ImageNotFound:
        raise AssertionError(f"base image {containers.BASE_IMAGE} is missing: `make image` builds it") from None
    client.images.build(
        path=str(FLEET_DIR), tag=NGINX_IMAGE, buildargs={"BASE": containers.BASE_IMAGE}, rm=True, pull=False
    )
    return NGINX_IMAGE


@pytest.fixture(scope="module")
def fleet(nginx_image: str) -> Iterator[Fleet]:
    containers.remove_leftovers()
    network = containers.create_network()
    started: list[containers.Container] = []
    started_at = time.monotonic()
    try:
        replicas = {}
        for name in REPLICAS:
            env = {"SHUTDOWN_GRACE_SECS": str(DRAIN_GRACE_S)} if name == DRAINED else {}
            replicas[name] = containers.start_container(
                REPLICA_ARGS, env=env, publish=False, network=network, alias=name
            )
            started.append(replicas[name])
        # nginx resolves the aliases when it starts: after the replicas' containers exist, before they are ready.
        nginx = containers.start_container(
            image=nginx_image, volumes=[(FLEET_DIR / "nginx.conf", "/etc/nginx/nginx.conf")], network=network
        )
        started.append(nginx)
        addresses = {}
        for name, replica in replicas.items():
            replica.wrapped.reload()
            ip = replica.wrapped.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
            addresses[f"{ip}:{containers.CONTAINER_PORT}"] = name
        fleet = Fleet(nginx=nginx, replicas=replicas, names_by_address=addresses)
        fleet.wait_ready(HEALTH_TIMEOUT_S)
        FIGURES["seconds_to_ready"] = round(time.monotonic() - started_at, 1)
        yield fleet
    finally:
        for container in reversed(started):
            container.remove()
        network.remove()
        report = os.environ.get("DECISION_FLEET_REPORT")
        if report and FIGURES:
            Path(report).write_text(json.dumps(FIGURES, indent=2) + "\n")


def test_affinity_computes_a_state_on_one_replica_where_round_robin_computes_it_on_each(fleet: Fleet) -> None:
    """Three states, three questions each, every question its own request, first through the round-robin upstream,
    then (states of their own) through the consistent hash on the key the client computed; each replica's /metrics
    says what it computed and what its prefix cache served."""
    states, questions = 3, 3
    figures: dict[str, Any] = {}
    with httpx2.Client(base_url=fleet.url, timeout=CALL_TIMEOUT_S) as client:
        for mode, prefix in (("round_robin", "/round-robin"), ("affinity", "")):
            per_state: list[dict[str, Any]] = []
            for s in range(states):
                state = state_of(mode, s)
                key = affinity_key(state)
                before = fleet.tokens()
                answered = []
                for q in range(questions):
                    body = {"state": state, "questions": nouls(f"point{q}")}
                    r = client.post(f"{prefix}/v1/systemone", json=body, headers={"x-decision-affinity": key})
                    assert r.status_code == 200, show(r)
                    assert r.headers["x-decision-affinity"] == key
                    answered += fleet.answered_by(r)
                after = fleet.tokens()
                computed = {n: after[n][0] - before[n][0] for n in REPLICAS}
                cached = {n: after[n][1] - before[n][1] for n in REPLICAS}
                per_state.append({"answered_by": answered, "computed": computed, "cached": cached})
            figures[mode] = {
                "computed_tokens_per_state": sum(sum(p["computed"].values()) for p in per_state) / states,
                "cached_tokens_per_state": sum(sum(p["cached"].values()) for p in per_state) / states,
                "replicas_computing_a_state": sum(sum(v > 0 for v in p["computed"].values()) for p in per_state)
                / states,
                "states": per_state,
            }
    FIGURES["affinity"] = figures
    for p in figures["round_robin"]["states"]:
        # One nginx worker takes the replicas in turn: a state's three questions reach three replicas, and each
        # computes the state.
        assert sorted(p["answered_by"]) == sorted(REPLICAS), p
        assert all(v > 0 for v in p["computed"].values()), p
    for p in figures["affinity"]["states"]:
        # Every question of the state on one replica: the others computed nothing and the first's cache served
        # the later questions.
        (holder,) = set(p["answered_by"])
        assert len(p["answered_by"]) == questions, p
        assert [n for n in REPLICAS if p["computed"][n] > 0 or p["cached"][n] > 0] == [holder], p
        assert p["cached"][holder] > 0, p
    rr, aff = figures["round_robin"], figures["affinity"]
    # The state's prefix dominates each prompt: three replicas computing it cost more than twice one doing so.
    assert rr["computed_tokens_per_state"] > 2 * aff["computed_tokens_per_state"], (rr, aff)
    assert aff["cached_tokens_per_state"] > rr["cached_tokens_per_state"], (rr, aff)
    FIGURES["memory_mib"] = fleet.memory_mib()


@dataclass
class Attempt:
    started: float
    ended: float
    status: int | None
    answered_by: list[str]
    retry_after: str | None = None
    error: str | None = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class Request:
    """One question and the client's attempts at it."""

    key: str
    client: int = 0
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def started(self) -> float:
        return self.attempts[0].started

    @property
    def answered(self) -> bool:
        return bool(self.attempts) and self.attempts[-1].status == 200

    @property
    def answered_by(self) -> str | None:
        """The replica that answered it (the last nginx tried on its last attempt)."""
        return self.attempts[-1].answered_by[-1] if self.answered and self.attempts[-1].answered_by else None

    @property
    def seconds(self) -> float:
        return self.attempts[-1].ended - self.started


def ask_until_answered(fleet: Fleet, http: httpx2.Client, state: Any, question: str, client: int = 0) -> Request:
    """One question as a well-behaved client asks it: refused (429/503/529), it waits Retry-After and asks again."""
    key = affinity_key(state)
    request = Request(key=key, client=client)
    body = {"state": state, "questions": nouls(question)}
    for _ in range(MAX_ATTEMPTS):
        started = time.monotonic()
        try:
            r = http.post("/v1/systemone", json=body, headers={"x-decision-affinity": key})
        except httpx2.HTTPError as e:
            error = f"{type(e).__name__}: {e}"
            request.attempts.append(Attempt(started, time.monotonic(), None, [], error=error))
            return request
        attempt = Attempt(started, time.monotonic(), r.status_code, fleet.answered_by(r), r.headers.get("retry-after"))
        request.attempts.append(attempt)
        if r.status_code not in RETRY_STATUSES:
            if r.status_code != 200:
                attempt.error = show(r, 500)
            return request
        if attempt.retry_after is None or not attempt.retry_after.isdigit():
            attempt.error = f"{r.status_code} without a Retry-After in seconds: {show(r, 500)}"
            return request
        time.sleep(int(attempt.retry_after))
    return request


def test_a_replica_stopped_under_load_costs_no_client_an_answer(fleet: Fleet) -> None:
    """`docker stop` with the image's defaults (10 s, then SIGKILL; an 8 s grace) on a replica while six clients keep
    asking: every answer is 200 or a refusal with Retry-After, every question is answered in the end (nginx or the
    client moves to another replica), nothing waits on the lost one, and its keys move to the others. Whether the
    replica made it out before the SIGKILL is the next test's (a drain with room); here it is only recorded."""
    clients = 6
    # Two states a client, four a replica, taken in turn: each client asks about states on two replicas.
    held = states_by_holder(fleet, "load", 4)
    logged_before = len(fleet.nginx_log())
    in_turn = [held[name][i] for i in range(4) for name in REPLICAS]
    done = threading.Event()
    requests: list[Request] = []
    lock = threading.Lock()

    def client_loop(c: int) -> None:
        with httpx2.Client(base_url=fleet.url, timeout=CALL_TIMEOUT_S) as client:
            q = 0
            while not done.is_set():
                request = ask_until_answered(fleet, client, in_turn[2 * c + q % 2], f"point{q}", client=c)
                with lock:
                    requests.append(request)
                q += 1

    threads = [threading.Thread(target=client_loop, args=(c,), daemon=True) for c in range(clients)]
    for thread in threads:
        thread.start()
    lost = fleet.replicas[LOST]

    def answered_by_lost() -> int:
        with lock:
            return sum(r.answered_by == LOST for r in requests)

    try:
        # Under way: the replica has answered some of the load and is computing more.
        deadline = time.monotonic() + 120
        while answered_by_lost() < 2 or fleet.series(LOST).get("decision_http_requests_in_flight", 0) < 1:
            assert time.monotonic() < deadline, f"{answered_by_lost()} answers from the replica to stop in 120 s"
            time.sleep(0.05)
        stopped_at = time.monotonic()
        took = lost.docker_stop(timeout_s=10)
        gone_at = stopped_at + took

        def asked_after_it_was_gone() -> list[Request]:
            with lock:
                return [r for r in requests if r.started > gone_at]

        # Load goes on until every client has asked about both its states after the stop.
        deadline = time.monotonic() + 120
        while min(sum(r.client == c for r in asked_after_it_was_gone()) for c in range(clients)) < 2:
            assert time.monotonic() < deadline, f"{len(asked_after_it_was_gone())} questions after the stop in 120 s"
            time.sleep(0.1)
    finally:
        done.set()
        for thread in threads:
            thread.join(CALL_TIMEOUT_S * MAX_ATTEMPTS)
    assert not any(thread.is_alive() for thread in threads), "a client hung"
    attempts = [a for r in requests for a in r.attempts]
    failures = [(r.key, a) for r in requests for a in r.attempts if a.error is not None]
    after = asked_after_it_was_gone()
    lost_keys = {affinity_key(state) for state in held[LOST]}
    moved = {r.key for r in after if r.answered and r.key in lost_keys}
    # nginx's own second tries: "503, 200" (a draining replica refused), "504, 200" (a connect timed out).
    statuses = [line.split(" statuses=")[1].split(" time=")[0] for line in fleet.nginx_log()[logged_before:]]
    nginx_retries = [s for s in statuses if "," in s]
    FIGURES["replica_loss"] = {
        "clients": clients,
        "questions": len(requests),
        "attempts": len(attempts),
        "answered_200": sum(a.status == 200 for a in attempts),
        "refused": {str(s): sum(a.status == s for a in attempts) for s in sorted(RETRY_STATUSES)},
        "questions_the_client_retried": sum(len(r.attempts) > 1 for r in requests),
        "requests_nginx_retried": nginx_retries,
        "answered_by_the_stopped_replica_during_its_stop": sum(
            r.answered_by == LOST and r.attempts[-1].ended > stopped_at for r in requests
        ),
        "its_keys_answered_elsewhere_after": len(moved),
        # nginx knows a replica is gone only by trying it: one try per fail_timeout (5 s) pays the connect timeout.
        "attempts_nginx_sent_to_it_after": sum(LOST in a.answered_by for r in after for a in r.attempts),
        "max_attempt_seconds": round(max(a.seconds for a in attempts), 2),
        "max_question_seconds": round(max(r.seconds for r in requests), 2),
        "docker_stop_seconds": round(took, 2),
        "exit_code": lost.exit_code(),
        "its_shutdown": shutdown_lines(lost),
        "failures": len(failures),
    }
    summary = {k: v for k, v in FIGURES["replica_loss"].items() if k != "its_shutdown"}
    assert failures == [], f"{failures[:5]}\n{summary}\n{lost.logs_tail()}"
    assert all(r.answered for r in requests), [r for r in requests if not r.answered][:5]
    assert {a.status for a in attempts} <= {200} | RETRY_STATUSES, summary
    assert all(r.answered_by != LOST for r in after), [r for r in after if r.answered_by == LOST]
    # Every key the consistent hash gave the lost replica was answered by the others once it was gone.
    assert moved == lost_keys, (summary, [r.key for r in after])


def test_a_replica_scaled_down_finishes_the_requests_it_accepted(fleet: Fleet) -> None:
    """SIGTERM as Kubernetes sends it at scale-down, with three long requests in flight on the replica: all three
    are answered 200 by it, a question asked meanwhile is answered by another replica, the replica exits 0 within its
    grace, and its keys are the survivor's afterwards."""
    drained = fleet.replicas[DRAINED]
    big_text = "The refund is late and the invoice total is wrong; I wrote three times and nobody answered. " * 30
    pinned = states_by_holder(fleet, "drain", 4, big_text)[DRAINED]
    in_flight_states, late_state = pinned[:3], pinned[3]
    results: list[httpx2.Response | str] = []

    def send(state: dict[str, str]) -> None:
        body = {"state": state, "questions": nouls(*(f"point{i}" for i in range(16)))}
        headers = {"x-decision-affinity": affinity_key(state)}
        try:
            results.append(httpx2.post(f"{fleet.url}/v1/systemone", json=body, headers=headers, timeout=CALL_TIMEOUT_S))
        except httpx2.HTTPError as e:
            results.append(f"{type(e).__name__}: {e}")

    senders = [threading.Thread(target=send, args=(state,), daemon=True) for state in in_flight_states]
    for sender in senders:
        sender.start()
    deadline = time.monotonic() + 60
    while fleet.series(DRAINED).get("decision_http_requests_in_flight", 0) < len(senders):
        assert time.monotonic() < deadline and not results, f"the requests did not all reach the replica: {results}"
        time.sleep(0.05)
    signalled = time.time()
    sigterm = ["docker", "kill", "--signal", "SIGTERM", drained.inner.get_container_id()]
    subprocess.run(sigterm, check=True, capture_output=True, timeout=30)
    assert not results, f"requests finished before the SIGTERM; make them longer: {results}"
    deadline = time.monotonic() + 10
    while "draining" not in httpx2.get(f"{fleet.url}/replica/{DRAINED}/ready", timeout=CALL_TIMEOUT_S).text:
        assert time.monotonic() < deadline, "the replica's /ready did not say draining within 10 s of the SIGTERM"
        time.sleep(0.05)
    # Asked while it drains: the replica refuses it (503), and nginx or the client takes it to another one.
    with httpx2.Client(base_url=fleet.url, timeout=CALL_TIMEOUT_S) as client:
        late = ask_until_answered(fleet, client, late_state, "late")
    for sender in senders:
        sender.join(DRAIN_GRACE_S + 15)
    code = drained.wait_exit(DRAIN_GRACE_S + 15)
    logs = drained.logs_tail()
    answers = [r for r in results if not isinstance(r, str)]
    assert [r.status_code for r in answers] == [200] * len(senders), (
        f"{[show(r) if not isinstance(r, str) else r for r in results]}\n{logs}"
    )
    # (A key of the stopped replica's would try it first and then come here: the last tried answered.)
    assert all(fleet.answered_by(r)[-1] == DRAINED for r in answers), [fleet.answered_by(r) for r in answers]
    assert late.answered and late.answered_by == SURVIVOR, late
    assert code == 0, logs
    # Gone: its keys are the survivor's now.
    with httpx2.Client(base_url=fleet.url, timeout=CALL_TIMEOUT_S) as client:
        after = ask_until_answered(fleet, client, in_flight_states[0], "after")
    assert after.answered and after.answered_by == SURVIVOR, after
    FIGURES["scale_down"] = {
        "in_flight_at_sigterm": len(senders),
        "answered_200_by_the_drained_replica": len(answers),
        "asked_while_draining": {
            "status": [a.status for a in late.attempts],
            "tried": [a.answered_by for a in late.attempts],
        },
        "sigterm_to_exit_seconds": round(drained.finished_at() - signalled, 2),
        "its_shutdown": shutdown_lines(drained),
        "exit_code": code,
    }
