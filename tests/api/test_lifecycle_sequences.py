"""Random sequences of lifecycle calls over HTTP (Hypothesis state machine, in-process app, real
SQLite file, two tenants): docs/contract.md, "Lifecycle", as a model the answers must agree with.

Each step is one call: prepare, get, validate, refresh, repair or a usage report, by the owner or
by the other tenant, with the frame, the input, the instructions or the usage object changed or
not. The machine keeps what the answers must be: another tenant always gets the 404 of an unknown
id and uses nothing up; refresh succeeds at most once and a failed one uses the attempt up; the
same ``report_id`` answers the same accounting (or a 422 for an invalid usage object, changing
nothing); a repair's report never reaches ``last``; an
unchanged frame validates until a refresh changes it. Every answer is JSON or problem+json, never
a 5xx.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from api_support import KEYS, basic_request, neutral_frame
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, rule

from context_assembly.api.app import create_app
from context_assembly.config import load_settings
from hypothesis_budget import examples

TENANTS = list(KEYS)
HEADERS = {tenant: {"Authorization": f"Bearer {key}"} for tenant, key in KEYS.items()}
STALE_REASONS = {
    "model_changed",
    "scope_changed",
    "prefix_changed",
    "input_changed",
    "refresh_used",
    "instructions_changed",
}
WORDS = st.sampled_from(["receipt", "A42", "status?", "é", "日本", '"q"', "\\n", " "])
texts = st.lists(WORDS, min_size=1, max_size=6).map(" ".join)
counts = st.one_of(st.integers(0, 10**7), st.integers(-5, 5), st.just(2**62))
usage_objects = st.one_of(
    st.fixed_dictionaries(
        {"prompt_tokens": counts},
        optional={
            "completion_tokens": counts,
            "prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": counts}),
        },
    ),
    st.fixed_dictionaries(
        {"input_tokens": counts},
        optional={
            "cache_read_input_tokens": counts,
            "cache_creation_input_tokens": counts,
            "output_tokens": counts,
        },
    ),
    st.fixed_dictionaries(
        {
            "usageMetadata": st.fixed_dictionaries(
                {"promptTokenCount": counts},
                optional={"cachedContentTokenCount": counts, "candidatesTokenCount": counts},
            )
        }
    ),
    st.dictionaries(st.sampled_from(["prompt_tokens", "x", "usage"]), counts, max_size=2),
)


class Lifecycle(RuleBasedStateMachine):
    preparations = Bundle("preparations")

    def __init__(self) -> None:
        super().__init__()
        self.folder = folder = Path(tempfile.mkdtemp(prefix="ca-lifecycle-"))
        settings_ = load_settings(
            store={"path": str(folder / "db.db")},
            auth={
                "mode": "api_key",
                "keys": [
                    {"tenant": t, "key_sha256": hashlib.sha256(k.encode()).hexdigest()}
                    for t, k in KEYS.items()
                ],
            },
        )
        self.client = TestClient(create_app(settings_), raise_server_exceptions=False)
        self.client.__enter__()
        self.model: dict[str, dict[str, Any]] = {}  # by preparation id

    def teardown(self) -> None:
        try:
            self.client.__exit__(None, None, None)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)  # each example's SQLite file

    def _call(self, method: str, path: str, tenant: str, body: Any = None) -> Any:
        response = self.client.request(method, path, json=body, headers=HEADERS[tenant])
        assert response.status_code < 500, (method, path, response.text)
        kind = response.headers["content-type"]
        if response.status_code >= 400:
            assert kind == "application/problem+json", (path, response.status_code, kind)
        return response

    def _other(self, tenant: str) -> str:
        return TENANTS[1 - TENANTS.index(tenant)]

    def _assert_unknown(self, method: str, path: str, pid: str, tenant: str, body: Any) -> None:
        """``tenant`` is not the owner: the answer is the 404 of an unknown id."""
        other = self._call(method, path, tenant, body)
        unknown = self._call(method, path.replace(pid, "prep_unknown_0000"), tenant, body)
        assert other.status_code == 404 == unknown.status_code, other.text
        assert other.json()["code"] == unknown.json()["code"] == "NOT_FOUND"

    # ------------------------------------------------------------------ rules

    @rule(
        target=preparations,
        tenant=st.sampled_from(TENANTS),
        question=texts,
        layout=st.sampled_from(["stable-prefix", "legacy"]),
    )
    def prepare(self, tenant: str, question: str, layout: str) -> str:
        # The neutral render: validate and repair take the frame back in that form.
        body = basic_request(
            input=[{"role": "user", "content": question}], assembly={"layout": layout}
        )
        response = self._call("POST", "/v1/prepare", tenant, body)
        assert response.status_code == 200, response.text
        prep = response.json()
        pid: str = prep["preparation_id"]
        self.model[pid] = {
            "tenant": tenant,
            "body": body,
            "prep": prep,
            "refresh_used": False,
            "refreshed": False,
            "reports": {},
            "last": None,
            "auxiliary": None,
        }
        return pid

    @rule(pid=preparations, owner=st.booleans())
    def get(self, pid: str, owner: bool) -> None:
        state = self.model[pid]
        path = f"/v1/preparations/{pid}"
        if not owner:
            self._assert_unknown("GET", path, pid, self._other(state["tenant"]), None)
            return
        view = self._call("GET", path, state["tenant"])
        assert view.status_code == 200, view.text
        accounting = view.json()["accounting"]
        assert accounting["last"] == state["last"]
        assert accounting["auxiliary"] == state["auxiliary"]

    @rule(
        pid=preparations,
        owner=st.booleans(),
        change=st.sampled_from(["none", "model", "scope", "input", "prefix"]),
    )
    def validate(self, pid: str, owner: bool, change: str) -> None:
        state = self.model[pid]
        frame = copy.deepcopy(neutral_frame(state["prep"]))
        body: dict[str, Any] = {"model": "gpt-4o-mini", "scope": {}, "frame": frame}
        if change == "model":
            body["model"] = "gpt-4o"
        elif change == "scope":
            body["scope"] = {"account_id": "other"}
        elif change == "input":
            frame["messages"][-1]["content"] = "another question entirely"
        elif change == "prefix":
            frame["messages"][0]["content"] = "a tampered host prompt"
        path = f"/v1/preparations/{pid}/validate"
        if not owner:
            self._assert_unknown("POST", path, pid, self._other(state["tenant"]), body)
            return
        response = self._call("POST", path, state["tenant"], body)
        assert response.status_code in (200, 409), response.text
        if change == "none" and not state["refreshed"]:
            assert response.status_code == 200, response.text
            assert response.json()["valid"] is True
        elif response.status_code == 409:
            reasons = response.json()["reasons"]
            assert reasons and set(reasons) <= STALE_REASONS, reasons

    @rule(
        pid=preparations,
        owner=st.booleans(),
        edit=st.sampled_from(["input", "instructions", "nothing"]),
        question=texts,
    )
    def refresh(self, pid: str, owner: bool, edit: str, question: str) -> None:
        state = self.model[pid]
        body = copy.deepcopy(state["body"])
        if edit == "input":
            body["input"] = [{"role": "user", "content": question + " (edited)"}]
        elif edit == "instructions":
            body["instructions"] = "Another host prompt."
        path = f"/v1/preparations/{pid}/refresh"
        if not owner:
            self._assert_unknown("POST", path, pid, self._other(state["tenant"]), body)
            return  # and the owner's attempt is not used up (the next owner refresh says so)
        response = self._call("POST", path, state["tenant"], body)
        if state["refresh_used"]:
            assert response.status_code == 409, response.text
            assert response.json()["reasons"] == ["refresh_used"]
            return
        state["refresh_used"] = True  # a failed refresh uses the attempt up too
        if edit == "instructions":
            assert response.status_code == 409, response.text
            return
        assert response.status_code == 200, response.text
        refreshed = response.json()
        assert refreshed["preparation_id"] == pid and refreshed["attempt"] == 2
        state["prep"] = refreshed
        state["refreshed"] = edit == "input"

    @rule(pid=preparations, owner=st.booleans(), same_instructions=st.booleans(), answer=texts)
    def repair(self, pid: str, owner: bool, same_instructions: bool, answer: str) -> None:
        state = self.model[pid]
        body = {
            "model": "gpt-4o-mini",
            "instructions": state["body"]["instructions"] if same_instructions else "Changed.",
            "frame": neutral_frame(state["prep"]),
            "answer": answer,
        }
        path = f"/v1/preparations/{pid}/repair"
        if not owner:
            self._assert_unknown("POST", path, pid, self._other(state["tenant"]), body)
            return
        response = self._call("POST", path, state["tenant"], body)
        if same_instructions:
            assert response.status_code == 200, response.text
            assert response.json()["frame"]["messages"][-2]["content"] == answer
        else:
            assert response.status_code == 409, response.text
            assert response.json()["reasons"] == ["instructions_changed"]

    @rule(
        pid=preparations,
        owner=st.booleans(),
        report_id=st.sampled_from(["r1", "r2", "r3"]),
        provider=st.sampled_from(["openai", "anthropic", "google"]),
        call=st.sampled_from(["main", "repair"]),
        usage=usage_objects,
    )
    def usage(
        self, pid: str, owner: bool, report_id: str, provider: str, call: str, usage: Any
    ) -> None:
        state = self.model[pid]
        body = {"report_id": report_id, "provider": provider, "call": call, "usage": usage}
        path = f"/v1/preparations/{pid}/usage"
        if not owner:
            self._assert_unknown("POST", path, pid, self._other(state["tenant"]), body)
            return
        response = self._call("POST", path, state["tenant"], body)
        if report_id in state["reports"]:
            # The same report id answers what it answered the first time, whatever valid usage
            # it carries; an invalid one is refused (422) as it would be under any id. Either
            # way nothing changes.
            if response.status_code == 422:
                view = self._call("GET", f"/v1/preparations/{pid}", state["tenant"]).json()
                assert view["accounting"]["last"] == state["last"]
                assert view["accounting"]["auxiliary"] == state["auxiliary"]
                return
            # The recorded observations, beside the preparation's current estimate (a refresh in
            # between lays a new frame and so a new estimate; the observations stay).
            assert response.status_code == 200, response.text
            first, again = state["reports"][report_id][1], response.json()
            current = self._call("GET", f"/v1/preparations/{pid}", state["tenant"]).json()
            estimate = current["accounting"]["estimated_input_tokens"]
            assert again["accounting"]["estimated_input_tokens"] == estimate

            def observations(answer: dict[str, Any]) -> dict[str, Any]:
                accounting = answer["accounting"]
                return {**answer, "accounting": {**accounting, "estimated_input_tokens": None}}

            assert observations(again) == observations(first)
            return
        if response.status_code != 200:
            assert response.status_code == 422, response.text
            return  # refused: nothing recorded, the id stays free
        accounting = response.json()["accounting"]
        state["reports"][report_id] = (200, response.json())
        if call == "main":
            assert accounting["last"]["report_id"] == report_id
            assert accounting["auxiliary"] == state["auxiliary"]
        else:
            assert accounting["auxiliary"]["report_id"] == report_id
            assert accounting["last"] == state["last"]  # a repair never overwrites last
        state["last"], state["auxiliary"] = accounting["last"], accounting["auxiliary"]


TestLifecycleSequences = Lifecycle.TestCase
TestLifecycleSequences.settings = settings(
    max_examples=examples(25),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
