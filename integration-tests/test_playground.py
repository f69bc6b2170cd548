"""The playground at `/` in a real headless Chromium (Debian's `chromium` and `chromedriver`, driven by selenium): the
form filled as a person would (a JSON state, questions of the three types added, edited and removed), submitted, and
the bars, confidences and label masses read back off the page and compared with the API's own answer to the same
request; the page's curl and Python snippets are run and give that answer too. A screenshot of each run is written
under integration-tests/artefacts/ (DECISION_TEST_ARTEFACTS elsewhere) and its path printed.

`make test` installs chromium and chromium-driver (the Makefile's `browser` target); a machine without them fails
here rather than skipping, so CI cannot pass without running the page."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from conftest import HEALTH_TIMEOUT_S
from launchers import Launcher, cache_dir

pytestmark = pytest.mark.local_only

ARTEFACTS = Path(os.environ.get("DECISION_TEST_ARTEFACTS") or Path(__file__).parent / "artefacts")
# The page shows 4 decimals; the same request answered twice may move by float noise (the suites' 1e-5).
SHOWN_TOL = 0.5e-4 + 1e-5
WAIT_S = 60.0

# What the test types: the state as JSON, a choice that gains an option, the default yes/no removed and another
# added with its sides described, a score whose levels are rewritten.
STATE = {"ticket": "I was charged twice for my subscription this month. Please refund one payment.", "plan": "pro"}
EXPECTED_REQUEST: dict[str, Any] = {
    "state": STATE,
    "instructions": "You route support tickets.",
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this message?",
            "criteria": {"billing": "payments and refunds", "technical": None, "account": "logins and profiles"},
        },
        "tone": {
            "type": "score",
            "instructions": "How upset is the writer?",
            "criteria": ["calm", "annoyed", "furious"],
        },
        "refund": {
            "type": "noul",
            "instructions": "Does the writer ask for money back?",
            "criteria": {"true": "a refund is requested"},
        },
    },
}


def _browser_binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail(
            "the playground test needs Debian's chromium and chromedriver: `make test` installs them as root "
            "(make browser), or `apt-get install chromium chromium-driver`",
            pytrace=False,
        )
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_path = _browser_binaries()
    # Selenium Manager would look for drivers online; the system's driver is named instead.
    os.environ.setdefault("SE_OFFLINE", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1100",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.1)


def screenshot(driver: Any, name: str) -> Path:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTEFACTS / f"{name}.png"
    # The whole page, not only the window: the answers sit below the fold on a narrow window.
    # Measured at the default size: a window grown for a longer page would keep this one as tall.
    driver.set_window_size(1400, 1100)
    driver.execute_script("window.scrollTo(0, 0)")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(1100, int(height) + 40))
    driver.save_screenshot(str(path))
    print(f"playground screenshot: {path}")
    return path


def type_into(element: Any, text: str) -> None:
    element.clear()
    element.send_keys(text)


def fill_form(driver: Any) -> None:
    from selenium.webdriver.common.by import By

    find = driver.find_element
    find(By.ID, "state-json-tab").click()
    type_into(find(By.ID, "state"), json.dumps(STATE))
    type_into(find(By.ID, "instructions"), EXPECTED_REQUEST["instructions"])
    questions = driver.find_elements(By.CSS_SELECTOR, "#questions .question")
    assert [q.find_element(By.CSS_SELECTOR, ".question-id").get_attribute("value") for q in questions] == [
        "team",
        "urgent",
        "tone",
    ]
    team, urgent, tone = questions
    # choice: describe billing, add a third option with a description.
    team.find_elements(By.CSS_SELECTOR, ".option-description")[0].send_keys("payments and refunds")
    team.find_element(By.CSS_SELECTOR, ".add-option").click()
    type_into(team.find_elements(By.CSS_SELECTOR, ".option-name")[2], "account")
    team.find_elements(By.CSS_SELECTOR, ".option-description")[2].send_keys("logins and profiles")
    # score: rewrite the default levels, dropping one and adding one.
    tone.find_elements(By.CSS_SELECTOR, ".option .link")[2].click()
    tone.find_element(By.CSS_SELECTOR, ".add-option").click()
    for field, level in zip(
        tone.find_elements(By.CSS_SELECTOR, ".option-name"), ["calm", "annoyed", "furious"], strict=True
    ):
        type_into(field, level)
    # noul: remove the default one, add another with its `true` side described.
    urgent.find_element(By.CSS_SELECTOR, ".remove-question").click()
    find(By.CSS_SELECTOR, "[data-add=noul]").click()
    refund = driver.find_elements(By.CSS_SELECTOR, "#questions .question")[-1]
    type_into(refund.find_element(By.CSS_SELECTOR, ".question-id"), "refund")
    type_into(refund.find_element(By.CSS_SELECTOR, ".question-instructions"), "Does the writer ask for money back?")
    refund.find_element(By.CSS_SELECTOR, ".noul-true").send_keys("a refund is requested")


def submit_and_read(driver: Any) -> dict[str, dict[str, Any]]:
    """Clicks Decide and reads every answer back off the page: the bars' shown values, and the summary line."""
    from selenium.webdriver.common.by import By

    driver.execute_script("document.getElementById('answers').replaceChildren()")
    driver.find_element(By.ID, "submit").click()
    wait_for(
        lambda: (
            driver.find_elements(By.CSS_SELECTOR, "#answers .answer")
            or driver.find_element(By.ID, "request-error").is_displayed()
        ),
        "the answer",
    )
    error = driver.find_element(By.ID, "request-error")
    assert not error.is_displayed(), error.text
    shown: dict[str, dict[str, Any]] = {}
    for answer in driver.find_elements(By.CSS_SELECTOR, "#answers .answer"):
        bars = {
            bar.get_attribute("data-option"): float(bar.find_element(By.CSS_SELECTOR, ".value").text)
            for bar in answer.find_elements(By.CSS_SELECTOR, ".bar")
        }
        summary = answer.find_element(By.CSS_SELECTOR, ".summary").text
        facts = {key: float(value) for key, value in re.findall(r"(confidence|label mass|score) (-?[\d.]+)", summary)}
        shown[answer.get_attribute("data-question")] = {
            "type": answer.get_attribute("data-type"),
            "bars": bars,
            **facts,
        }
    return shown


def expected_bars(answer: dict[str, Any]) -> dict[str, float]:
    if answer["type"] == "noul":
        return {"yes": answer["noul"], "no": 1 - answer["noul"]}
    if answer["type"] == "score":
        return {answer["legend"][i]: p for i, p in answer["probabilities"].items()}
    return dict(answer["probabilities"])


def assert_page_matches(shown: dict[str, dict[str, Any]], api: dict[str, Any]) -> None:
    assert list(shown) == list(api["answers"]), (list(shown), list(api["answers"]))
    for qid, answer in api["answers"].items():
        page = shown[qid]
        assert page["type"] == answer["type"], qid
        expected = expected_bars(answer)
        assert list(page["bars"]) == list(expected), (qid, page["bars"], expected)
        for option, p in expected.items():
            assert abs(page["bars"][option] - p) <= SHOWN_TOL, (qid, option, page["bars"][option], p)
        mass = api["x_diagnostics"][qid]["label_mass"]
        assert abs(page["label mass"] - mass) <= SHOWN_TOL, (qid, page, mass)
        if answer.get("confidence") is not None:
            assert abs(page["confidence"] - answer["confidence"]) <= SHOWN_TOL, (qid, page, answer)
        else:
            assert "confidence" not in page, (qid, page)
        if answer["type"] == "score":
            assert abs(page["score"] - answer["score"]) <= 0.5e-3 + 1e-5, (qid, page, answer)


def snippet(driver: Any, kind: str) -> str:
    from selenium.webdriver.common.by import By

    text = driver.find_element(By.ID, f"snippet-{kind}").get_attribute("data-full")
    assert isinstance(text, str) and text, kind
    return text


def curl_body(command: str) -> Any:
    words = shlex.split(command.replace("\\\n", " "))
    return json.loads(words[words.index("-d") + 1])


def test_the_page_answers_as_the_api_does(browser: Any, server_url: str, http: httpx2.Client) -> None:
    from selenium.webdriver.common.by import By

    started = time.monotonic()
    browser.get(server_url + "/")
    info = http.get("/info").json()
    wait_for(lambda: info["model_id"] in browser.find_element(By.ID, "model").text, "the model's name from /info")
    # The suite's SmolLM2 reads no images: no image input (test_the_image_input_* has one that does).
    assert info["modalities"] == []
    assert not browser.find_element(By.ID, "image-box").is_displayed()
    fill_form(browser)

    # The request the page built is exactly the one a client would write, in curl and in Python.
    curl = snippet(browser, "curl")
    assert curl_body(curl) == EXPECTED_REQUEST, curl
    assert "Authorization" not in curl

    shown = submit_and_read(browser)
    api = http.post("/v1/systemone", json=EXPECTED_REQUEST)
    assert api.status_code == 200, api.text
    assert_page_matches(shown, api.json())
    screenshot(browser, "playground")

    # Both snippets, run as a user would paste them, answer the same.
    python = subprocess.run(
        [sys.executable, "-c", snippet(browser, "python")], check=False, capture_output=True, text=True, timeout=120
    )
    assert python.returncode == 0, python.stderr
    from_python = json.loads(python.stdout)
    if shutil.which("curl"):
        from_curl = json.loads(
            subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=120, check=True).stdout
        )
        assert from_curl["answers"].keys() == api.json()["answers"].keys()
    for qid, answer in api.json()["answers"].items():
        for option, p in expected_bars(answer).items():
            assert abs(expected_bars(from_python["answers"][qid])[option] - p) < 1e-5, (qid, option)
    print(f"playground round trip: {time.monotonic() - started:.1f} s")


def test_the_page_shows_errors_and_sends_nothing_invalid(browser: Any, server_url: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(server_url + "/")
    find = browser.find_element
    # A JSON state that does not parse is named on the page and no request leaves it.
    find(By.ID, "state-json-tab").click()
    type_into(find(By.ID, "state"), '{"ticket": ')
    find(By.ID, "submit").click()
    error = wait_for(lambda: find(By.ID, "state-error").is_displayed() and find(By.ID, "state-error"), "the JSON error")
    assert "not valid JSON" in error.text, error.text
    assert not find(By.ID, "request-error").is_displayed()
    # The API's own refusal (a blank option name: 422) is shown with its status and the field it names.
    find(By.ID, "state-text-tab").click()
    type_into(find(By.ID, "state"), "a message")
    team = browser.find_elements(By.CSS_SELECTOR, "#questions .question")[0]
    type_into(team.find_elements(By.CSS_SELECTOR, ".option-name")[1], " ")
    find(By.ID, "submit").click()
    shown = wait_for(
        lambda: find(By.ID, "request-error").is_displayed() and find(By.ID, "request-error").text, "the API's error"
    )
    assert shown.startswith("422") and "team" in shown, shown
    assert not browser.find_elements(By.CSS_SELECTOR, "#answers .answer")


@pytest.fixture(scope="module")
def keyed_image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """The tiny LFM2-VL (it reads images) behind an API key: one extra server for both checks."""
    from launchers import start_launcher

    model_dir = cache_dir() / "models" / "tiny-lfm2-vl"
    assert model_dir.joinpath("processor_config.json").is_file(), f"{model_dir} has no processor: run `make fixtures`"
    launcher = start_launcher(
        tmp_path_factory.mktemp("playground"),
        ["--model-id", str(model_dir), "--dtype", "float32", "--hostname", "127.0.0.1", "--api-key", "play-key"],
        name="playground_keyed",
    )
    try:
        launcher.wait_healthy(HEALTH_TIMEOUT_S)
        yield launcher
    finally:
        launcher.stop(grace_s=20.0)


def test_with_an_api_key_the_page_asks_for_it_and_reads_an_image(
    browser: Any, keyed_image_server: Launcher, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url = keyed_image_server.url
    browser.get(url + "/")
    find = browser.find_element
    # The page loads, but /info refuses it: it asks for the key and shows no model.
    banner = wait_for(lambda: find(By.ID, "key-needed").is_displayed() and find(By.ID, "key-needed"), "the key prompt")
    assert "API key" in banner.text
    assert not find(By.ID, "image-box").is_displayed()
    # Without the key a submit is refused and says so.
    find(By.ID, "submit").click()
    refused = wait_for(
        lambda: find(By.ID, "request-error").is_displayed() and find(By.ID, "request-error").text, "the 401"
    )
    assert refused.startswith("401"), refused
    # With it, /info answers: the model reads images, so the page offers an image input.
    find(By.ID, "api-key").send_keys("play-key", Keys.TAB)
    wait_for(lambda: not find(By.ID, "key-needed").is_displayed(), "the key prompt to go")
    wait_for(lambda: find(By.ID, "image-box").is_displayed(), "the image input")
    from PIL import Image

    image = tmp_path / "square.png"
    Image.new("RGB", (64, 48), (200, 40, 40)).save(image)
    find(By.ID, "image").send_keys(str(image))
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#image-preview img"), "the image preview")
    curl = snippet(browser, "curl")
    assert '-H "Authorization: Bearer $DECISION_API_KEY"' in curl and "play-key" not in curl, curl
    body = curl_body(curl)
    assert len(body["images"]) == 1 and body["images"][0].startswith("data:image/png;base64,")
    shown = submit_and_read(browser)
    api = httpx2.post(f"{url}/v1/systemone", json=body, headers={"Authorization": "Bearer play-key"}, timeout=120)
    assert api.status_code == 200, api.text
    assert_page_matches(shown, api.json())
    screenshot(browser, "playground-image")


def test_swagger_ui_renders_the_document_with_its_examples(browser: Any, server_url: str, http: httpx2.Client) -> None:
    """Swagger UI at /docs runs from the binary's own files under its policy (no other origin) and lists every route
    of the document; the examples of each request are the document's."""
    from selenium.webdriver.common.by import By

    browser.get(server_url + "/docs")
    document = http.get("/api-doc/openapi.json").json()
    routes = {(method.upper(), path) for path, item in document["paths"].items() for method in item}
    shown = wait_for(
        lambda: (
            (
                found := {
                    (
                        block.find_element(By.CSS_SELECTOR, ".opblock-summary-method").text,
                        block.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path"),
                    )
                    for block in browser.find_elements(By.CSS_SELECTOR, ".opblock")
                }
            )
            == routes
            and found
        ),
        "Swagger UI to list every route",
    )
    assert shown == routes
    # Open /v1/systemone: its request example is the document's.
    block = next(
        b
        for b in browser.find_elements(By.CSS_SELECTOR, ".opblock")
        if b.find_element(By.CSS_SELECTOR, ".opblock-summary-path").get_attribute("data-path") == "/v1/systemone"
    )
    block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
    wait_for(lambda: "payments and refunds" in block.text, "the request example")
    # Nothing was fetched from anywhere but this server (the policy would have refused it, and logged it).
    refused = [entry for entry in browser.get_log("browser") if "Content Security Policy" in entry.get("message", "")]
    assert not refused, refused
    screenshot(browser, "swagger-ui")


def test_every_request_example_in_the_document_answers_as_its_example(http: httpx2.Client) -> None:
    """The OpenAPI document's examples are live: each request example answers one of its documented successes
    (200 for a decision, 201 for a stored calibration, 200 or 201 for an import) with that example answer's fields.
    What an example stores is deleted again, so the session's server is left as it was found."""
    document = http.get("/api-doc/openapi.json").json()
    checked = 0
    created: list[str] = []
    try:
        for path, item in document["paths"].items():
            operation = item.get("post")
            if operation is None:
                continue
            requests = operation["requestBody"]["content"]["application/json"]["examples"]
            successes = {code: answer for code, answer in operation["responses"].items() if code.startswith("2")}
            assert successes, (path, sorted(operation["responses"]))
            for name, request in requests.items():
                r = http.post(path, json=request["value"])
                assert str(r.status_code) in successes, (path, name, r.status_code, r.text)
                answers = successes[str(r.status_code)]["content"]["application/json"]["examples"]
                expected = (answers.get(name) or next(iter(answers.values())))["value"]
                got = r.json()
                if r.status_code == 201 and path.startswith("/v1/calibrations"):
                    created.append(got["id"])
                assert set(expected) - {"x_cached_tokens"} <= set(got), (path, name, sorted(got), sorted(expected))
                if isinstance(expected.get("answers"), dict):
                    assert list(got["answers"]) == list(expected["answers"]), (path, name)
                checked += 1
    finally:
        for calibration in created:
            assert http.delete(f"/v1/calibrations/{calibration}").status_code == 204, calibration
    # Three decision shapes, a calibration fit and an import at least.
    assert checked >= 6, checked
