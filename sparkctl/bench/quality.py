"""The quality suite's scenarios and their rule-based scorers. PURE.

Owns: 16 structured-output scenarios (JSON to a schema, tool calls, SQL,
arithmetic) and one scorer per scenario that turns the answer text into a
:class:`Score` by rule, never by judgement: JSON is parsed and checked
against its schema and values, tool calls by name and arguments, SQL by
running it on a small in-memory SQLite fixture and comparing the rows, and
arithmetic by the last number in the answer.

Must not: send requests, read files or a clock. SQLite runs in memory only.

Answers are normalized first: ``<think>...</think>`` blocks are dropped and a
fenced code block (```json ... ```) is unwrapped, so a model that explains
before answering is judged on its answer.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Score:
    passed: bool
    reason: str


@dataclass(frozen=True)
class Scenario:
    id: str
    category: str  # json | tool_call | sql | arithmetic
    prompt: str
    scorer: Callable[[str], Score]
    max_tokens: int = 256


# --------------------------------------------------------------------------- normalizing

_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.S)


def clean(answer: str | None) -> str:
    text = _THINK.sub("", answer or "")
    if "<think>" in text and "</think>" not in text:  # unterminated thinking: nothing was answered
        return ""
    m = _FENCE.search(text)
    return (m.group(1) if m else text).strip()


def _json(answer: str | None) -> tuple[Any, str]:
    text = clean(answer)
    try:
        return json.loads(text), ""
    except ValueError:
        pass
    # the first JSON object or array in the text
    for opener, closer in (("{", "}"), ("[", "]")):
        i, j = text.find(opener), text.rfind(closer)
        if 0 <= i < j:
            try:
                return json.loads(text[i:j + 1]), ""
            except ValueError:
                continue
    return None, "no JSON found"


def _typed(obj: Any, schema: dict[str, type | tuple[type, ...]]) -> str:
    if not isinstance(obj, dict):
        return "not a JSON object"
    missing = [k for k in schema if k not in obj]
    if missing:
        return f"missing keys {missing}"
    extra = [k for k in obj if k not in schema]
    if extra:
        return f"unexpected keys {extra}"
    for k, t in schema.items():
        v = obj[k]
        if isinstance(v, bool) and bool not in (t if isinstance(t, tuple) else (t,)):
            return f"{k} is a boolean"
        if not isinstance(v, t):
            return f"{k} has type {type(v).__name__}"
    return ""


def json_scorer(schema: dict[str, type | tuple[type, ...]], expect: dict[str, Any]) -> Callable[[str], Score]:
    def score(answer: str) -> Score:
        obj, err = _json(answer)
        if err:
            return Score(False, err)
        bad = _typed(obj, schema)
        if bad:
            return Score(False, bad)
        for k, v in expect.items():
            got = obj[k]
            if isinstance(v, str) and isinstance(got, str):
                if got.strip().lower() != v.lower():
                    return Score(False, f"{k}={got!r}, expected {v!r}")
            elif got != v:
                return Score(False, f"{k}={got!r}, expected {v!r}")
        return Score(True, "schema and values match")
    return score


def json_value_scorer(expect: Any) -> Callable[[str], Score]:
    def score(answer: str) -> Score:
        obj, err = _json(answer)
        if err:
            return Score(False, err)
        return Score(obj == expect, "equal" if obj == expect else f"got {json.dumps(obj)[:80]}")
    return score


def tool_scorer(name: str, arguments: dict[str, Any]) -> Callable[[str], Score]:
    """``{"name": ..., "arguments": {...}}`` with exactly the expected arguments (strings case-insensitive)."""
    def score(answer: str) -> Score:
        obj, err = _json(answer)
        if err:
            return Score(False, err)
        if isinstance(obj, dict) and "function" in obj and isinstance(obj["function"], dict):
            obj = obj["function"]  # the OpenAI tool_calls shape is accepted too
        if not isinstance(obj, dict) or obj.get("name") != name:
            return Score(False, f"tool {obj.get('name') if isinstance(obj, dict) else None!r}, expected {name!r}")
        args = obj.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return Score(False, "arguments are not JSON")
        if not isinstance(args, dict) or set(args) != set(arguments):
            return Score(False, f"arguments {sorted(args) if isinstance(args, dict) else args!r}")
        for k, v in arguments.items():
            got = args[k]
            same = got.strip().lower() == v.lower() if isinstance(v, str) and isinstance(got, str) else got == v
            if not same:
                return Score(False, f"argument {k}={got!r}, expected {v!r}")
        return Score(True, "tool call matches")
    return score


_SQL_FIXTURE = """
CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT, dept TEXT, salary INTEGER);
INSERT INTO employees VALUES (1,'Ada','sales',62000),(2,'Ben','sales',48000),(3,'Cleo','eng',91000),
  (4,'Dan','eng',87000),(5,'Eve','sales',75000),(6,'Finn','support',41000);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT);
INSERT INTO customers VALUES (1,'Acme'),(2,'Globex'),(3,'Initech'),(4,'Umbrella');
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, total INTEGER);
INSERT INTO orders VALUES (1,1,100),(2,1,250),(3,2,75),(4,4,300),(5,4,20);
"""


def _run_sql(query: str) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(_SQL_FIXTURE)
        return [tuple(r) for r in con.execute(query).fetchall()]
    finally:
        con.close()


def sql_scorer(reference: str, ordered: bool = False) -> Callable[[str], Score]:
    """The answer's rows on the fixture equal the reference query's rows."""
    want = _run_sql(reference)

    def score(answer: str) -> Score:
        text = clean(answer).rstrip().rstrip(";")
        m = re.search(r"\b(SELECT|WITH)\b", text, re.I)
        if not m:
            return Score(False, "no SELECT")
        query = text[m.start():].split(";")[0]
        try:
            got = _run_sql(query)
        except sqlite3.Error as exc:
            return Score(False, f"sqlite: {exc}")
        same = got == want if ordered else sorted(map(repr, got)) == sorted(map(repr, want))
        return Score(same, "rows match" if same else f"{len(got)} rows differ from the reference")
    return score


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def number_scorer(expect: float) -> Callable[[str], Score]:
    """The last number in the answer equals ``expect`` (commas ignored)."""
    def score(answer: str) -> Score:
        nums = _NUMBER.findall(clean(answer))
        if not nums:
            return Score(False, "no number")
        got = float(nums[-1].replace(",", ""))
        ok = abs(got - expect) < 1e-6 * max(1.0, abs(expect))
        return Score(ok, "correct" if ok else f"got {nums[-1]}, expected {expect:g}")
    return score


# --------------------------------------------------------------------------- the scenarios

_ONLY_JSON = "Output only the JSON, nothing else."
_TOOL = ('Reply only with a JSON object {"name": TOOL_NAME, "arguments": {...}} calling the right tool; '
         "no other text.")

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("json_person", "json",
             "Return a JSON object with keys name (string), age (integer) and email (string) for this person: "
             f"Ada Lovelace, 36 years old, ada@example.org. {_ONLY_JSON}",
             json_scorer({"name": str, "age": int, "email": str},
                         {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org"})),
    Scenario("json_primes", "json", f"Return a JSON array of the first five prime numbers. {_ONLY_JSON}",
             json_value_scorer([2, 3, 5, 7, 11])),
    Scenario("json_sentiment", "json",
             'Classify the sentiment of this review as "positive", "negative" or "neutral": "The fan is loud and '
             'the unit died after two days." Return {"sentiment": LABEL, "confidence": NUMBER between 0 and 1}. '
             + _ONLY_JSON,
             json_scorer({"sentiment": str, "confidence": (int, float)}, {"sentiment": "negative"})),
    Scenario("json_extract", "json",
             "Extract the order from this text as JSON with keys item (string), quantity (integer) and "
             "unit_price (number): 'Please send 12 QSFP cables at 39.5 dollars each.' " + _ONLY_JSON,
             json_scorer({"item": str, "quantity": int, "unit_price": (int, float)},
                         {"quantity": 12, "unit_price": 39.5})),
    Scenario("json_valid_date", "json",
             'Is 2026-02-30 a valid calendar date? Return {"valid": true} or {"valid": false}. ' + _ONLY_JSON,
             json_value_scorer({"valid": False})),
    Scenario("tool_weather", "tool_call",
             'Tools: get_weather(city: string, unit: "celsius" | "fahrenheit"); get_time(city: string). '
             f"{_TOOL} Request: what is the weather in Oslo, in celsius?",
             tool_scorer("get_weather", {"city": "Oslo", "unit": "celsius"})),
    Scenario("tool_calendar", "tool_call",
             "Tools: create_event(title: string, date: string YYYY-MM-DD, duration_minutes: integer); "
             f"list_events(date: string). {_TOOL} Request: book a 45 minute 'ring maintenance' on 2026-11-03.",
             tool_scorer("create_event", {"title": "ring maintenance", "date": "2026-11-03", "duration_minutes": 45})),
    Scenario("tool_choice", "tool_call",
             "Tools: search_web(query: string); calculator(expression: string). "
             f"{_TOOL} Request: compute 17*23 exactly; use the expression 17*23.",
             tool_scorer("calculator", {"expression": "17*23"})),
    Scenario("sql_filter", "sql",
             "Table employees(id, name, dept, salary). Write one SQLite query returning the name of every employee "
             "in dept 'sales' earning more than 50000. Output only SQL.",
             sql_scorer("SELECT name FROM employees WHERE dept='sales' AND salary>50000")),
    Scenario("sql_group", "sql",
             "Table employees(id, name, dept, salary). Write one SQLite query returning dept and the number of "
             "employees in it, one row per dept, ordered by dept. Output only SQL.",
             sql_scorer("SELECT dept, COUNT(*) FROM employees GROUP BY dept ORDER BY dept", ordered=True)),
    Scenario("sql_anti_join", "sql",
             "Tables customers(id, name) and orders(id, customer_id, total). Write one SQLite query returning the "
             "name of every customer without any order. Output only SQL.",
             sql_scorer("SELECT name FROM customers WHERE id NOT IN (SELECT customer_id FROM orders)")),
    Scenario("sql_top", "sql",
             "Tables customers(id, name) and orders(id, customer_id, total). Write one SQLite query returning the "
             "name and total spend of the customer who spent the most (one row). Output only SQL.",
             sql_scorer("SELECT c.name, SUM(o.total) FROM customers c JOIN orders o ON o.customer_id=c.id "
                        "GROUP BY c.id ORDER BY SUM(o.total) DESC LIMIT 1")),
    Scenario("math_product", "arithmetic", "What is 348 * 27? Answer with the number only.", number_scorer(9396)),
    Scenario("math_speed", "arithmetic",
             "A train covers 180 km in 2.5 hours. What is its average speed in km/h? Answer with the number only.",
             number_scorer(72)),
    Scenario("math_sum", "arithmetic", "What is the sum of the integers from 1 to 100? Answer with the number only.",
             number_scorer(5050)),
    Scenario("math_power", "arithmetic",
             "Four nodes draw 34 W each for 90 seconds. How many joules is that in total? Answer with the number only.",
             number_scorer(12240)),
)


def score(scenario_id: str, answer: str | None) -> Score:
    """Score ``answer`` for the scenario ``scenario_id``."""
    for s in SCENARIOS:
        if s.id == scenario_id:
            return s.scorer(answer or "")
    raise KeyError(scenario_id)
