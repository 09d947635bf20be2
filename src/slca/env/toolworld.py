"""``toolworld``: the built-in tool-use task suite.

Small enough for a few-million-parameter model trained from scratch on a CPU:
templated requests with a modest vocabulary, short argument values (city names,
ISO dates, tickers, small numbers, ids), small JSON results and short answers.

* 11 training tools in 5 domains (weather, travel, finance, dining, calendar)
  and 4 held-out tools (sports, geography) for generalisation.
* Task kinds: ``single`` (one call), ``parallel`` (independent calls that can
  share one turn -- the paper's diagnostic case, the most common kind),
  ``chain`` (a result feeds the next call), ``no_tool`` and ``unservable``
  (the request cannot be served with the offered tools).
* Splits (:data:`SPLITS`):

  - ``train``: train entities (cities, tickers, people, event titles, teams)
    and train phrasings (the first four request templates of each task type).
  - ``train_heldout``: held-out tasks *of the training distribution* (train
    entities and train phrasings) whose request text appears neither in the
    warm start's demonstrations (:data:`WARMSTART_DEMOS`) nor in the RL task
    pool of a run with the same seed (``make_tasks("train", seed=seed)``), nor
    twice in the split. This is the in-distribution held-out set (the paper's
    in-domain figure). Kinds are drawn in their usual proportions; a kind whose
    unseen requests run out (the training distribution has only a few hundred
    refusal requests, nearly all in the demonstrations) is left out from then on,
    so ``unservable`` and ``no_tool`` are rarer here than in ``train``.
  - ``test``: test entities and test phrasings (the last two templates):
    out of distribution on both axes.
  - ``test_entities``: test entities, train phrasings; ``test_phrasings``: train
    entities, test phrasings (the two diagnostic cells between ``train`` and ``test``),
    deduplicated like ``train_heldout`` (requests with no entity, such as "Play some
    music.", would otherwise repeat train's).
  - ``heldout_tools``: only the held-out tools (never offered elsewhere), test entities.
  - ``fresh``: the training tools with entities and request phrasings new to toolworld
    (:data:`FRESH_ENTITIES`, :data:`FRESH_TEMPLATES`): in no other split, and no name in the
    warm start's synthetic-name pools (``recipes.warmstart.augment.faker_names``; checked by
    ``tests/test_toolworld_fresh.py``). Fixed on 2026-12-03 before anything was measured on it and
    never used to choose a build, a recipe or a setting: the out-of-distribution set whose figure
    slca quotes. (``test`` chose the shipped warm start among its builds, so its figure is not
    independent of that choice.)

The world is deterministic: every tool's answer is a pure function of its
arguments (plus the episode's state for the stateful tools), so each task's
``answer_facts`` -- the values a good final answer must state -- are computed by
running the gold calls through the same simulator a rollout talks to
(:func:`make_env`). ``task.reference_answer`` is a templated answer
stating those facts (for warm-start data).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slca.env.schema import ToolBox
from slca.env.simulators import PythonSimulator, SchemaSimulator, Simulator, ToolError
from slca.types import Task, ToolCall, ToolResult

__all__ = ["TOOLS", "HELDOUT_TOOLS", "FUNCTIONS", "SPLITS", "FRESH_ENTITIES", "FRESH_TEMPLATES", "KINDS", "WARMSTART_DEMOS", "make_tasks", "request_templates", "make_env", "tool", "run_gold"]

SPLITS = ("train", "train_heldout", "test", "test_entities", "test_phrasings", "heldout_tools", "fresh")
KINDS = ("single", "parallel", "chain", "no_tool", "unservable")
_KIND_WEIGHTS = {"single": 0.25, "parallel": 0.35, "chain": 0.2, "no_tool": 0.1, "unservable": 0.1}
_DEFAULT_N = {"train": 2000, "train_heldout": 600, "test": 300, "test_entities": 300, "test_phrasings": 300, "heldout_tools": 200, "fresh": 300}
WARMSTART_DEMOS = (12000, 0)
"""``(n_tasks, data_seed)`` of the shipped warm start's demonstrations
(`recipes/warmstart` BuildConfig; a test keeps the two equal): their
requests are ``make_tasks("train", n_tasks, data_seed)``, which ``train_heldout`` excludes."""
_MAX_DRAWS = 64  # draws per held-out task before its kind counts as exhausted


def _h(*parts: Any) -> int:
    """Stable hash of the arguments (the world's randomness)."""
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big")


# ------------------------------------------------------------------ tool schemas

_DATE = {"type": "string", "format": "date", "description": "YYYY-MM-DD"}
_CITY = {"type": "string", "minLength": 1}
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy"]
LEVELS = ["good", "moderate", "poor"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF"]
_RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 155.0, "CHF": 0.88}
CUISINES = ["italian", "thai", "indian", "mexican", "japanese", "french"]
RESULTS = ["win", "draw", "loss"]


def tool(name: str, description: str, params: dict[str, Any], required: list[str], response: dict[str, Any], domain: str, stateful: bool = False) -> dict[str, Any]:
    """An OpenAI tool dict with a response schema and toolworld's private keys."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": params, "required": required, "additionalProperties": False},
            "response": {"type": "object", "properties": response, "required": list(response), "additionalProperties": False},
            "x-domain": domain,
            "x-stateful": stateful,
        },
    }


def _id(prefix: str) -> dict[str, Any]:
    return {"type": "string", "pattern": f"^{prefix}[0-9]{{3}}$"}


TOOLS: list[dict[str, Any]] = [
    tool("get_weather", "Weather in a city on a date.", {"city": _CITY, "date": _DATE}, ["city", "date"],
         {"city": {"type": "string"}, "date": _DATE, "temp_c": {"type": "integer", "minimum": -20, "maximum": 45},
          "condition": {"type": "string", "enum": CONDITIONS}}, "weather"),
    tool("get_air_quality", "Air quality index of a city.", {"city": _CITY}, ["city"],
         {"city": {"type": "string"}, "aqi": {"type": "integer", "minimum": 0, "maximum": 300},
          "level": {"type": "string", "enum": LEVELS}}, "weather"),
    tool("search_flights", "Find a flight between two cities on a date.",
         {"origin": _CITY, "destination": _CITY, "date": _DATE}, ["origin", "destination", "date"],
         {"flight_id": _id("FL"), "price": {"type": "integer", "minimum": 0}}, "travel"),
    tool("book_flight", "Book a flight for a passenger.", {"flight_id": _id("FL"), "passenger": {"type": "string", "minLength": 1}},
         ["flight_id", "passenger"], {"booking_id": _id("BK"), "status": {"type": "string", "enum": ["confirmed"]}},
         "travel", stateful=True),
    tool("get_booking", "Look up a flight booking.", {"booking_id": _id("BK")}, ["booking_id"],
         {"booking_id": _id("BK"), "flight_id": _id("FL"), "passenger": {"type": "string"},
          "status": {"type": "string", "enum": ["confirmed"]}}, "travel", stateful=True),
    tool("get_stock_price", "Latest price of a stock in USD.", {"symbol": {"type": "string", "pattern": "^[A-Z]{2,5}$"}}, ["symbol"],
         {"symbol": {"type": "string"}, "price": {"type": "integer", "minimum": 0}}, "finance"),
    tool("convert_currency", "Convert an amount between currencies.",
         {"amount": {"type": "number", "minimum": 0}, "from_currency": {"type": "string", "enum": CURRENCIES},
          "to_currency": {"type": "string", "enum": CURRENCIES}}, ["amount", "from_currency", "to_currency"],
         {"amount": {"type": "number"}, "currency": {"type": "string", "enum": CURRENCIES}}, "finance"),
    tool("find_restaurant", "Find a restaurant by city and cuisine.",
         {"city": _CITY, "cuisine": {"type": "string", "enum": CUISINES}}, ["city", "cuisine"],
         {"restaurant_id": _id("R"), "name": {"type": "string"}, "rating": {"type": "number", "minimum": 0, "maximum": 5}}, "dining"),
    tool("book_table", "Book a table at a restaurant.",
         {"restaurant_id": _id("R"), "people": {"type": "integer", "minimum": 1, "maximum": 12}, "date": _DATE},
         ["restaurant_id", "people", "date"],
         {"reservation_id": _id("T"), "status": {"type": "string", "enum": ["confirmed"]}}, "dining", stateful=True),
    tool("create_event", "Add an event to the calendar.", {"title": {"type": "string", "minLength": 1}, "date": _DATE},
         ["title", "date"], {"event_id": _id("E"), "status": {"type": "string", "enum": ["created"]}}, "calendar", stateful=True),
    tool("list_events", "List calendar events on a date.", {"date": _DATE}, ["date"],
         {"date": _DATE, "events": {"type": "array", "items": {"type": "string"}}}, "calendar", stateful=True),
]

HELDOUT_TOOLS: list[dict[str, Any]] = [
    tool("get_match_score", "Score of a team's match on a date.", {"team": {"type": "string", "minLength": 1}, "date": _DATE},
         ["team", "date"], {"team": {"type": "string"}, "score": {"type": "string", "pattern": "^[0-9]-[0-9]$"},
                            "result": {"type": "string", "enum": RESULTS}}, "sports"),
    tool("get_population", "Population of a city.", {"city": _CITY}, ["city"],
         {"city": {"type": "string"}, "population": {"type": "integer", "minimum": 0}}, "geography"),
    tool("get_sunrise", "Sunrise and sunset times in a city on a date.", {"city": _CITY, "date": _DATE}, ["city", "date"],
         {"sunrise": {"type": "string"}, "sunset": {"type": "string"}}, "geography"),
    tool("get_utc_offset", "UTC offset of a city in hours.", {"city": _CITY}, ["city"],
         {"city": {"type": "string"}, "utc_offset": {"type": "integer", "minimum": -12, "maximum": 14}}, "geography"),
]

_BY_NAME = {t["function"]["name"]: t for t in TOOLS + HELDOUT_TOOLS}


# ------------------------------------------------------------- implementations

_ADJ = ["Golden", "Blue", "Little", "Green", "Old", "Red", "Silver", "Happy"]
_NOUN = ["Fork", "Spoon", "Garden", "Table", "Lantern", "Olive", "Harbor", "Oven"]


def _get_weather(city: str, date: str) -> dict[str, Any]:
    h = _h("weather", city, date)
    return {"city": city, "date": date, "temp_c": -5 + h % 40, "condition": CONDITIONS[(h >> 8) % len(CONDITIONS)]}


def _get_air_quality(city: str) -> dict[str, Any]:
    aqi = 10 + _h("aqi", city) % 170
    return {"city": city, "aqi": aqi, "level": "good" if aqi < 50 else "moderate" if aqi < 100 else "poor"}


def _search_flights(origin: str, destination: str, date: str) -> dict[str, Any]:
    if origin.strip().lower() == destination.strip().lower():
        raise ToolError("origin and destination must differ")
    h = _h("flight", origin, destination, date)
    return {"flight_id": f"FL{100 + h % 900}", "price": 60 + (h >> 10) % 840}


def _book_flight(flight_id: str, passenger: str, state: dict) -> dict[str, Any]:
    bid = f"BK{100 + _h('booking', flight_id, passenger) % 900}"
    state.setdefault("bookings", {})[bid] = {"booking_id": bid, "flight_id": flight_id, "passenger": passenger, "status": "confirmed"}
    return {"booking_id": bid, "status": "confirmed"}


def _get_booking(booking_id: str, state: dict) -> dict[str, Any]:
    rec = state.get("bookings", {}).get(booking_id)
    if rec is None:
        raise ToolError(f"no booking {booking_id}")
    return dict(rec)


def _get_stock_price(symbol: str) -> dict[str, Any]:
    return {"symbol": symbol, "price": 20 + _h("stock", symbol) % 880}


def _convert_currency(amount: float, from_currency: str, to_currency: str) -> dict[str, Any]:
    return {"amount": round(amount * _RATES[to_currency] / _RATES[from_currency], 2), "currency": to_currency}


def _find_restaurant(city: str, cuisine: str) -> dict[str, Any]:
    h = _h("restaurant", city, cuisine)
    return {"restaurant_id": f"R{100 + h % 900}", "name": f"{_ADJ[(h >> 10) % 8]} {_NOUN[(h >> 13) % 8]}",
            "rating": round(3.0 + ((h >> 16) % 21) / 10, 1)}


def _book_table(restaurant_id: str, people: int, date: str, state: dict) -> dict[str, Any]:
    rid = f"T{100 + _h('table', restaurant_id, people, date) % 900}"
    state.setdefault("tables", {})[rid] = {"restaurant_id": restaurant_id, "people": people, "date": date}
    return {"reservation_id": rid, "status": "confirmed"}


def _create_event(title: str, date: str, state: dict) -> dict[str, Any]:
    eid = f"E{100 + _h('event', title, date) % 900}"
    state.setdefault("events", {}).setdefault(date, []).append(title)
    return {"event_id": eid, "status": "created"}


def _list_events(date: str, state: dict) -> dict[str, Any]:
    return {"date": date, "events": list(state.get("events", {}).get(date, []))}


def _get_match_score(team: str, date: str) -> dict[str, Any]:
    h = _h("match", team, date)
    a, b = h % 5, (h >> 4) % 5
    return {"team": team, "score": f"{a}-{b}", "result": "win" if a > b else "draw" if a == b else "loss"}


def _get_population(city: str) -> dict[str, Any]:
    return {"city": city, "population": 1000 * (50 + _h("pop", city) % 9000)}


def _get_sunrise(city: str, date: str) -> dict[str, Any]:
    h = _h("sun", city, date)
    return {"sunrise": f"0{4 + h % 4}:{(h >> 3) % 60:02d}", "sunset": f"{18 + (h >> 9) % 4}:{(h >> 12) % 60:02d}"}


def _get_utc_offset(city: str) -> dict[str, Any]:
    return {"city": city, "utc_offset": -11 + _h("tz", city) % 25}


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "get_weather": _get_weather, "get_air_quality": _get_air_quality, "search_flights": _search_flights,
    "book_flight": _book_flight, "get_booking": _get_booking, "get_stock_price": _get_stock_price,
    "convert_currency": _convert_currency, "find_restaurant": _find_restaurant, "book_table": _book_table,
    "create_event": _create_event, "list_events": _list_events, "get_match_score": _get_match_score,
    "get_population": _get_population, "get_sunrise": _get_sunrise, "get_utc_offset": _get_utc_offset,
}

_TOOLBOXES: dict[tuple[str, ...], ToolBox] = {}


def _all_tools_box() -> ToolBox:
    key = ("*",)
    if key not in _TOOLBOXES:
        _TOOLBOXES[key] = ToolBox(TOOLS + HELDOUT_TOOLS)
    return _TOOLBOXES[key]


def make_env(task: Task, seed: int = 0) -> Simulator:
    """The simulator a rollout of ``task`` talks to.

    Tasks whose tools are all toolworld tools get the deterministic Python
    world (``seed`` is unused: the world is fixed, so ``answer_facts`` hold).
    Any other task (e.g. one loaded from a dataset) gets a
    ``SchemaSimulator(task.tools, seed)``. Build one per rollout, or pass a
    distinct ``episode`` per rollout: stateful tools keep state per episode.
    """
    names = tuple(_tool_name(t) for t in task.tools)
    if all(n in FUNCTIONS and _BY_NAME[n] == t for n, t in zip(names, task.tools)):
        box = _TOOLBOXES.get(names)
        if box is None:
            box = _TOOLBOXES[names] = ToolBox(task.tools)
        return PythonSimulator(box, {n: FUNCTIONS[n] for n in names})
    return SchemaSimulator(task.tools, seed=seed)


def _tool_name(t: dict[str, Any]) -> str:
    return t.get("function", t).get("name", "")


def run_gold(task: Task, env: Simulator | None = None, episode: str | int = "gold") -> list[list[Any]]:
    """Run the gold steps through ``env`` (default ``make_env(task)``); the results per step."""
    env = env if env is not None else make_env(task)
    return [[env.call(c.name, c.arguments, episode=episode) for c in step] for step in task.gold]


# ------------------------------------------------------------------- entities

_CITIES = sorted(
    "Paris Rome Berlin Madrid Lisbon Vienna Prague Oslo Dublin Athens Cairo Tokyo Seoul Lima Quito Delhi "
    "Dubai Doha Riga Sofia Milan Nice Lyon Porto Bern Zurich Munich London Boston Denver Austin Miami "
    "Toronto Sydney Perth Nairobi Accra Havana Bogota Manila Hanoi Bangkok Osaka Warsaw Helsinki Geneva "
    "Venice Seville".split()
)
_SYMBOLS = sorted("AAPL MSFT GOOG AMZN TSLA NVDA META IBM INTC ORCL NFLX ADBE CSCO PEP KO NKE DIS SAP SONY UBER".split())
_PEOPLE = sorted("Anna Ben Carla David Elena Farid Grace Hugo Ines Jon Kira Liam Maya Nina Omar Paul Rosa Sam Tara Vera Will Yara Zoe Leo".split())
_TITLES = sorted(["standup", "dentist", "yoga", "review", "lunch", "gym", "interview", "workshop", "dinner", "call",
                  "haircut", "piano lesson"])
_TEAMS = sorted("Lions Tigers Eagles Sharks Wolves Bears Hawks Falcons Rangers Rovers".split())
_DATES = [f"2025-07-{d:02d}" for d in range(1, 29)]


@dataclass(frozen=True)
class _Entities:
    cities: list[str]
    symbols: list[str]
    people: list[str]
    titles: list[str]
    teams: list[str]

    def all(self) -> list[str]:
        """Every entity of every kind."""
        return [*self.cities, *self.symbols, *self.people, *self.titles, *self.teams]


# ``fresh``: entities new to toolworld (fixed 2026-12-03, before anything was measured on them). Chosen from
# real capitals, sports nicknames, rare given names, tickers and appointments, keeping only those that are in
# no other split and (every word) not in the warm start's synthetic-name pools, so no build has seen them.
FRESH_ENTITIES = _Entities(
    cities=sorted("Tromso Valletta Tbilisi Yerevan Almaty Windhoek Gaborone Montevideo Cusco Reykjavik Tallinn Vilnius "
                  "Skopje Tirana Kigali Dakar Lusaka Maputo Kathmandu Colombo Vientiane Tashkent Paramaribo Anchorage".split()),
    symbols=sorted("QCOM AVGO TXN AMD SHOP PYPL CRM ASML SBUX BKNG".split()),
    people=sorted("Ottoline Peregrine Wystan Caspian Hyacinth Lysander Cressida Fenwick Xanthe Melisande Prospero Quiller".split()),
    titles=sorted(["physiotherapy", "choir rehearsal", "chess club", "karaoke", "barbecue", "flu shot", "passport renewal",
                   "tennis match"]),
    teams=sorted("Comets Pirates Mariners Orioles Ravens Hornets Stallions Pelicans".split()),
)
"""The entities of the ``fresh`` split (cities, tickers, people, event titles, teams)."""


def entities(split: str) -> _Entities:
    """The entities a split draws its tasks from: the train entities for ``train``, ``train_heldout`` and
    ``test_phrasings``, :data:`FRESH_ENTITIES` for ``fresh``, the test entities (disjoint) for the others.
    Dates are shared."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return _split_entities(split)


def _split_entities(split: str) -> _Entities:
    if split == "fresh":
        return FRESH_ENTITIES
    return _entities("train" if split in _TRAIN_ENTITIES else "test")


def _entities(split: str) -> _Entities:
    """Every fourth entity is test-only; train gets the rest (disjoint by construction)."""
    def part(xs: list[str]) -> list[str]:
        return [x for i, x in enumerate(xs) if (i % 4 == 3) == (split != "train")]
    return _Entities(part(_CITIES), part(_SYMBOLS), part(_PEOPLE), part(_TITLES), part(_TEAMS))


# ------------------------------------------------------------------ task types
#
# Each task type samples slots, plans the gold steps against the live world
# (chains read earlier results) and writes the reference answer. Its request
# templates: the first four are train phrasing, the last two test phrasing.


@dataclass(frozen=True)
class _Draw:
    """What a task type's builder draws for one task."""

    slots: dict[str, Any]
    """Values for the request template's ``{slots}``."""
    gold: list[list[ToolCall]]
    answer: str
    """The reference answer (``Task.reference_answer``)."""
    facts: list[str]
    """``Task.answer_facts``."""
    entities: list[str]
    """The entities the request names (``meta["entities"]``)."""


@dataclass(frozen=True)
class _TaskType:
    name: str
    kind: str
    templates: tuple[str, ...]
    build: Callable[[random.Random, _Entities, Simulator], _Draw]
    heldout: bool = False


def _call(env: Simulator, name: str, **args: Any) -> tuple[ToolCall, dict[str, Any]]:
    r = env.call(name, args, episode="gold")
    if not r.ok:
        raise RuntimeError(f"toolworld generator: gold call {name}({args}) failed: {r.error}")
    return ToolCall(name, args), r.content


class _GoldProbe:
    """The world a draw's gold calls run in while a task is generated: each tool's function called directly, with a
    state of its own (stateful tools start empty).

    A :class:`PythonSimulator` answers the same (the tools are deterministic) and also checks every argument and
    result against the schemas and runs each call under a deadline: three quarters of the generation's time, paid
    by every process that builds a split (``train_heldout`` first generates the 12,000 requests it leaves out). The
    generator's gold calls are its own; ``tests/test_env_toolworld.py`` generates every split through a
    ``PythonSimulator`` and gets the same tasks, so the checks still hold for every request generated here."""

    def __init__(self) -> None:
        self._state: dict[str, Any] = {}

    def call(self, name: str, arguments: dict, episode: str | int = 0) -> ToolResult:
        fn = FUNCTIONS[name]
        kwargs = {**arguments, "state": self._state} if name in _takes_state() else dict(arguments)
        try:
            return ToolResult(ok=True, content=fn(**kwargs))
        except (ToolError, ValueError) as e:
            return ToolResult(ok=False, error=str(e))


@functools.cache
def _takes_state() -> frozenset[str]:
    """The toolworld tools whose function takes the episode's ``state``."""
    return frozenset(n for n, f in FUNCTIONS.items() if "state" in inspect.signature(f).parameters)


def _probe() -> Simulator | _GoldProbe:
    """A fresh world for one draw (tests swap in a :class:`PythonSimulator` here to check the generator's calls)."""
    return _GoldProbe()


def _weather(rng, E, env):
    city, date = rng.choice(E.cities), rng.choice(_DATES)
    c, r = _call(env, "get_weather", city=city, date=date)
    return _Draw({"city": city, "date": date}, [[c]], f"In {city} on {date} it is {r['temp_c']} C and {r['condition']}.",
            [str(r["temp_c"]), r["condition"]], [city])


def _air(rng, E, env):
    city = rng.choice(E.cities)
    c, r = _call(env, "get_air_quality", city=city)
    return _Draw({"city": city}, [[c]], f"The air quality in {city} is {r['level']} (AQI {r['aqi']}).", [str(r["aqi"]), r["level"]], [city])


def _stock(rng, E, env):
    s = rng.choice(E.symbols)
    c, r = _call(env, "get_stock_price", symbol=s)
    return _Draw({"symbol": s}, [[c]], f"{s} trades at {r['price']} USD.", [str(r["price"])], [s])


def _flight(rng, E, env):
    o, d = rng.sample(E.cities, 2)
    date = rng.choice(_DATES)
    c, r = _call(env, "search_flights", origin=o, destination=d, date=date)
    return _Draw({"origin": o, "destination": d, "date": date}, [[c]],
            f"Flight {r['flight_id']} from {o} to {d} on {date} costs {r['price']} USD.", [r["flight_id"], str(r["price"])], [o, d])


def _restaurant(rng, E, env):
    city, cuisine = rng.choice(E.cities), rng.choice(CUISINES)
    c, r = _call(env, "find_restaurant", city=city, cuisine=cuisine)
    return _Draw({"city": city, "cuisine": cuisine}, [[c]],
            f"{r['name']} ({r['restaurant_id']}) is a {cuisine} restaurant in {city} rated {r['rating']}.",
            [r["name"], str(r["rating"])], [city])


def _convert(rng, E, env):
    amount = rng.choice([5, 10, 20, 25, 50, 100, 200, 250, 500])
    src, dst = rng.sample(CURRENCIES, 2)
    c, r = _call(env, "convert_currency", amount=amount, from_currency=src, to_currency=dst)
    return _Draw({"amount": amount, "src": src, "dst": dst}, [[c]], f"{amount} {src} is {r['amount']} {dst}.", [str(r["amount"])], [])


def _event(rng, E, env):
    title, date = rng.choice(E.titles), rng.choice(_DATES)
    c, r = _call(env, "create_event", title=title, date=date)
    return _Draw({"title": title, "date": date}, [[c]], f"I added {title} on {date} (event {r['event_id']}).", [r["event_id"]], [title])


def _weather2(rng, E, env):
    c1, c2 = rng.sample(E.cities, 2)
    date = rng.choice(_DATES)
    a, ra = _call(env, "get_weather", city=c1, date=date)
    b, rb = _call(env, "get_weather", city=c2, date=date)
    return _Draw({"city1": c1, "city2": c2, "date": date}, [[a, b]],
            f"On {date} {c1} is {ra['temp_c']} C and {ra['condition']}, {c2} is {rb['temp_c']} C and {rb['condition']}.",
            [str(ra["temp_c"]), ra["condition"], str(rb["temp_c"]), rb["condition"]], [c1, c2])


def _stock2(rng, E, env):
    s1, s2 = rng.sample(E.symbols, 2)
    a, ra = _call(env, "get_stock_price", symbol=s1)
    b, rb = _call(env, "get_stock_price", symbol=s2)
    return _Draw({"s1": s1, "s2": s2}, [[a, b]], f"{s1} trades at {ra['price']} USD and {s2} at {rb['price']} USD.",
            [str(ra["price"]), str(rb["price"])], [s1, s2])


def _air2(rng, E, env):
    c1, c2 = rng.sample(E.cities, 2)
    a, ra = _call(env, "get_air_quality", city=c1)
    b, rb = _call(env, "get_air_quality", city=c2)
    return _Draw({"city1": c1, "city2": c2}, [[a, b]],
            f"The AQI is {ra['aqi']} ({ra['level']}) in {c1} and {rb['aqi']} ({rb['level']}) in {c2}.",
            [str(ra["aqi"]), str(rb["aqi"])], [c1, c2])


def _weather_air(rng, E, env):
    city, date = rng.choice(E.cities), rng.choice(_DATES)
    a, ra = _call(env, "get_weather", city=city, date=date)
    b, rb = _call(env, "get_air_quality", city=city)
    return _Draw({"city": city, "date": date}, [[a, b]],
            f"In {city} on {date} it is {ra['temp_c']} C and {ra['condition']}; the air quality is {rb['level']} (AQI {rb['aqi']}).",
            [str(ra["temp_c"]), ra["condition"], str(rb["aqi"])], [city])


def _weather_stock(rng, E, env):
    city, date, s = rng.choice(E.cities), rng.choice(_DATES), rng.choice(E.symbols)
    a, ra = _call(env, "get_weather", city=city, date=date)
    b, rb = _call(env, "get_stock_price", symbol=s)
    return _Draw({"city": city, "date": date, "symbol": s}, [[a, b]],
            f"In {city} on {date} it is {ra['temp_c']} C and {ra['condition']}; {s} trades at {rb['price']} USD.",
            [str(ra["temp_c"]), ra["condition"], str(rb["price"])], [city, s])


def _flight_book(rng, E, env):
    o, d = rng.sample(E.cities, 2)
    date, p = rng.choice(_DATES), rng.choice(E.people)
    a, ra = _call(env, "search_flights", origin=o, destination=d, date=date)
    b, rb = _call(env, "book_flight", flight_id=ra["flight_id"], passenger=p)
    return _Draw({"origin": o, "destination": d, "date": date, "passenger": p}, [[a], [b]],
            f"I booked flight {ra['flight_id']} for {p}; booking {rb['booking_id']} is confirmed.",
            [ra["flight_id"], rb["booking_id"]], [o, d, p])


def _stock_convert(rng, E, env):
    s, dst = rng.choice(E.symbols), rng.choice([c for c in CURRENCIES if c != "USD"])
    a, ra = _call(env, "get_stock_price", symbol=s)
    b, rb = _call(env, "convert_currency", amount=ra["price"], from_currency="USD", to_currency=dst)
    return _Draw({"symbol": s, "dst": dst}, [[a], [b]], f"{s} trades at {ra['price']} USD, which is {rb['amount']} {dst}.",
            [str(rb["amount"])], [s])


def _restaurant_book(rng, E, env):
    city, cuisine, date, people = rng.choice(E.cities), rng.choice(CUISINES), rng.choice(_DATES), rng.randint(2, 8)
    a, ra = _call(env, "find_restaurant", city=city, cuisine=cuisine)
    b, rb = _call(env, "book_table", restaurant_id=ra["restaurant_id"], people=people, date=date)
    return _Draw({"city": city, "cuisine": cuisine, "date": date, "people": people}, [[a], [b]],
            f"I booked a table for {people} at {ra['name']} on {date}; reservation {rb['reservation_id']} is confirmed.",
            [ra["name"], rb["reservation_id"]], [city])


def _event_list(rng, E, env):
    title, date = rng.choice(E.titles), rng.choice(_DATES)
    a, ra = _call(env, "create_event", title=title, date=date)
    b, rb = _call(env, "list_events", date=date)
    return _Draw({"title": title, "date": date}, [[a], [b]],
            f"I added {title} (event {ra['event_id']}). Your events on {date}: {', '.join(rb['events'])}.",
            [ra["event_id"], *rb["events"]], [title])


def _greet(rng, E, env):
    p = rng.choice(E.people)
    return _Draw({"name": p}, [], f"Hello {p}! How can I help you today?", [p], [p])


def _add(rng, E, env):
    a, b = rng.randint(1, 20), rng.randint(1, 20)
    return _Draw({"a": a, "b": b}, [], f"{a} plus {b} is {a + b}.", [str(a + b)], [])


_UNSERVABLE = {"taxi": "book a taxi", "email": "send emails", "music": "play music", "pizza": "order food"}


def _unservable(what: str):
    def build(rng, E, env):
        return _Draw({"city": rng.choice(E.cities), "name": rng.choice(E.people)}, [],
                f"Sorry, I cannot {_UNSERVABLE[what]} with the available tools.", [], [])
    return build


def _population(rng, E, env):
    city = rng.choice(E.cities)
    c, r = _call(env, "get_population", city=city)
    return _Draw({"city": city}, [[c]], f"{city} has {r['population']} people.", [str(r["population"])], [city])


def _score(rng, E, env):
    team, date = rng.choice(E.teams), rng.choice(_DATES)
    c, r = _call(env, "get_match_score", team=team, date=date)
    return _Draw({"team": team, "date": date}, [[c]], f"The {team} played {r['score']} on {date}, a {r['result']}.",
            [r["score"], r["result"]], [team])


def _sunrise(rng, E, env):
    city, date = rng.choice(E.cities), rng.choice(_DATES)
    c, r = _call(env, "get_sunrise", city=city, date=date)
    return _Draw({"city": city, "date": date}, [[c]], f"In {city} on {date} the sun rises at {r['sunrise']} and sets at {r['sunset']}.",
            [r["sunrise"], r["sunset"]], [city])


def _offset2(rng, E, env):
    c1, c2 = rng.sample(E.cities, 2)
    a, ra = _call(env, "get_utc_offset", city=c1)
    b, rb = _call(env, "get_utc_offset", city=c2)
    return _Draw({"city1": c1, "city2": c2}, [[a, b]], f"{c1} is at UTC {ra['utc_offset']:+d} and {c2} at UTC {rb['utc_offset']:+d}.",
            [str(ra["utc_offset"]), str(rb["utc_offset"])], [c1, c2])


def _population2(rng, E, env):
    c1, c2 = rng.sample(E.cities, 2)
    a, ra = _call(env, "get_population", city=c1)
    b, rb = _call(env, "get_population", city=c2)
    return _Draw({"city1": c1, "city2": c2}, [[a, b]], f"{c1} has {ra['population']} people and {c2} has {rb['population']}.",
            [str(ra["population"]), str(rb["population"])], [c1, c2])


def _score2(rng, E, env):
    t1, t2 = rng.sample(E.teams, 2)
    date = rng.choice(_DATES)
    a, ra = _call(env, "get_match_score", team=t1, date=date)
    b, rb = _call(env, "get_match_score", team=t2, date=date)
    return _Draw({"team1": t1, "team2": t2, "date": date}, [[a, b]],
            f"On {date} the {t1} played {ra['score']} and the {t2} played {rb['score']}.", [ra["score"], rb["score"]], [t1, t2])


_TYPES: list[_TaskType] = [
    _TaskType("weather", "single", (
        "What is the weather in {city} on {date}?", "How is the weather in {city} on {date}?",
        "Tell me the weather for {city} on {date}.", "Weather in {city} on {date}, please.",
        "I need the weather forecast for {city} on {date}.", "Could you check the weather in {city} for {date}?"), _weather),
    _TaskType("air", "single", (
        "What is the air quality in {city}?", "How clean is the air in {city}?", "Tell me the air quality of {city}.",
        "Air quality in {city}, please.", "Is the air in {city} good today?", "Could you check the AQI of {city}?"), _air),
    _TaskType("stock", "single", (
        "What is the stock price of {symbol}?", "How much is {symbol} trading at?", "Tell me the price of {symbol}.",
        "Price of {symbol} stock, please.", "Look up the share price for {symbol}.", "Could you check {symbol} stock?"), _stock),
    _TaskType("flight", "single", (
        "Find a flight from {origin} to {destination} on {date}.", "Search flights from {origin} to {destination} on {date}.",
        "Is there a flight from {origin} to {destination} on {date}?", "Show me a flight {origin} to {destination} on {date}.",
        "I want to fly from {origin} to {destination} on {date}.", "Could you look up flights {origin} to {destination} for {date}?"),
        _flight),
    _TaskType("restaurant", "single", (
        "Find a {cuisine} restaurant in {city}.", "Where can I eat {cuisine} food in {city}?",
        "Recommend a {cuisine} restaurant in {city}.", "Search for {cuisine} food in {city}.",
        "I want {cuisine} food in {city}.", "Could you look up a {cuisine} place in {city}?"), _restaurant),
    _TaskType("convert", "single", (
        "Convert {amount} {src} to {dst}.", "How much is {amount} {src} in {dst}?", "Change {amount} {src} into {dst}.",
        "What is {amount} {src} in {dst}?", "I need {amount} {src} expressed in {dst}.", "Could you convert {amount} {src} into {dst}?"),
        _convert),
    _TaskType("event", "single", (
        "Add {title} to my calendar on {date}.", "Create a {title} event on {date}.", "Put {title} on my calendar for {date}.",
        "Schedule {title} on {date}.", "I need {title} in my calendar on {date}.", "Could you add {title} for {date}?"), _event),
    _TaskType("weather2", "parallel", (
        "What is the weather in {city1} and {city2} on {date}?", "How is the weather in {city1} and in {city2} on {date}?",
        "Tell me the weather for {city1} and {city2} on {date}.", "Weather in {city1} and {city2} on {date}, please.",
        "I need the weather for both {city1} and {city2} on {date}.", "Could you compare the weather in {city1} and {city2} for {date}?"),
        _weather2),
    _TaskType("stock2", "parallel", (
        "What are the stock prices of {s1} and {s2}?", "How much are {s1} and {s2} trading at?",
        "Tell me the prices of {s1} and {s2}.", "Prices of {s1} and {s2} stock, please.",
        "Look up the share prices for {s1} and {s2}.", "Could you check {s1} and {s2} stock?"), _stock2),
    _TaskType("air2", "parallel", (
        "What is the air quality in {city1} and {city2}?", "How clean is the air in {city1} and in {city2}?",
        "Tell me the air quality of {city1} and {city2}.", "Air quality in {city1} and {city2}, please.",
        "Is the air better in {city1} or in {city2}?", "Could you compare the AQI of {city1} and {city2}?"), _air2),
    _TaskType("weather_air", "parallel", (
        "What is the weather and air quality in {city} on {date}?", "How is the weather in {city} on {date}, and how clean is the air?",
        "Tell me the weather and the air quality for {city} on {date}.", "Weather and air quality in {city} on {date}, please.",
        "I need the forecast for {city} on {date} and its AQI.", "Could you check the weather in {city} for {date} and the air there?"),
        _weather_air),
    _TaskType("weather_stock", "parallel", (
        "What is the weather in {city} on {date} and the price of {symbol}?",
        "How is the weather in {city} on {date}, and what is {symbol} trading at?",
        "Tell me the weather for {city} on {date} and the price of {symbol}.",
        "Weather in {city} on {date} and {symbol} stock, please.",
        "I need the forecast for {city} on {date} and the share price of {symbol}.",
        "Could you check the weather in {city} for {date} and {symbol} stock?"), _weather_stock),
    _TaskType("flight_book", "chain", (
        "Find a flight from {origin} to {destination} on {date} and book it for {passenger}.",
        "Book {passenger} on a flight from {origin} to {destination} on {date}.",
        "Search a flight {origin} to {destination} on {date}, then book it for {passenger}.",
        "Get {passenger} a flight from {origin} to {destination} on {date}.",
        "I want {passenger} booked on a flight from {origin} to {destination} on {date}.",
        "Could you reserve a flight from {origin} to {destination} on {date} for {passenger}?"), _flight_book),
    _TaskType("stock_convert", "chain", (
        "What is the price of {symbol} in {dst}?", "How much is {symbol} stock in {dst}?",
        "Tell me the price of {symbol} converted to {dst}.", "Price of {symbol} in {dst}, please.",
        "I need the share price of {symbol} expressed in {dst}.", "Could you give me {symbol} stock in {dst}?"), _stock_convert),
    _TaskType("restaurant_book", "chain", (
        "Find a {cuisine} restaurant in {city} and book a table for {people} on {date}.",
        "Book a table for {people} at a {cuisine} restaurant in {city} on {date}.",
        "Search {cuisine} food in {city}, then reserve a table for {people} on {date}.",
        "Get me a {cuisine} table for {people} in {city} on {date}.",
        "I want a {cuisine} dinner for {people} in {city} on {date}, please book it.",
        "Could you reserve a {cuisine} place in {city} for {people} people on {date}?"), _restaurant_book),
    _TaskType("event_list", "chain", (
        "Add {title} on {date} and then show my events for that day.", "Create a {title} event on {date} and list my events that day.",
        "Put {title} on my calendar for {date}, then tell me what is on that day.",
        "Schedule {title} on {date} and show the day's events.",
        "I need {title} on {date}; after that, what is on my calendar that day?",
        "Could you add {title} for {date} and then list that day's events?"), _event_list),
    _TaskType("greet", "no_tool", (
        "Hi, I am {name}.", "Hello, my name is {name}.", "Good morning, this is {name}.", "Hey there, I am {name}!",
        "Greetings from {name}.", "Hi! {name} here."), _greet),
    _TaskType("add", "no_tool", (
        "What is {a} plus {b}?", "How much is {a} plus {b}?", "Add {a} and {b}.", "Compute {a} plus {b}.",
        "I need the sum of {a} and {b}.", "Could you add {a} to {b}?"), _add),
    _TaskType("taxi", "unservable", (
        "Book a taxi in {city}.", "Call me a cab in {city}.", "Get a taxi to the airport in {city}.", "I need a taxi in {city}.",
        "Please order a ride in {city}.", "Could you send a cab to me in {city}?"), _unservable("taxi")),
    _TaskType("email", "unservable", (
        "Send an email to {name}.", "Email {name} for me.", "Write an email to {name}.", "Mail {name} a note.",
        "Please drop {name} an email.", "Could you message {name} by email?"), _unservable("email")),
    _TaskType("music", "unservable", (
        "Play some music.", "Put on a song.", "Play music for me.", "Start some music.",
        "Please play my playlist.", "Could you play a song for me?"), _unservable("music")),
    _TaskType("pizza", "unservable", (
        "Order a pizza in {city}.", "Get me a pizza delivered in {city}.", "Order food to my home in {city}.",
        "I want a pizza in {city}.", "Please order dinner to {city}.", "Could you get food delivered in {city}?"), _unservable("pizza")),
    # held-out tools: never offered in train or test tasks
    _TaskType("population", "single", ("What is the population of {city}?", "How many people live in {city}?"), _population, True),
    _TaskType("score", "single", ("What was the score of the {team} on {date}?", "How did the {team} play on {date}?"), _score, True),
    _TaskType("sunrise", "single", ("When is sunrise in {city} on {date}?", "When does the sun rise in {city} on {date}?"), _sunrise, True),
    _TaskType("offset2", "parallel", ("What are the UTC offsets of {city1} and {city2}?", "Which time zones are {city1} and {city2} in?"),
              _offset2, True),
    _TaskType("population2", "parallel", ("What are the populations of {city1} and {city2}?",
                                           "How many people live in {city1} and in {city2}?"), _population2, True),
    _TaskType("score2", "parallel", ("What were the scores of the {team1} and the {team2} on {date}?",
                                     "How did the {team1} and the {team2} play on {date}?"), _score2, True),
]

_TRAIN_TOOL_NAMES = [t["function"]["name"] for t in TOOLS]
_HELDOUT_TOOL_NAMES = [t["function"]["name"] for t in HELDOUT_TOOLS]


_TRAIN_PHRASING = ("train", "train_heldout", "test_entities")
_TRAIN_ENTITIES = ("train", "train_heldout", "test_phrasings")
_DEDUPED = ("train_heldout", "test_entities", "test_phrasings")


# ``fresh``: two request phrasings per training task type, new to toolworld (fixed 2026-12-03 with
# FRESH_ENTITIES): none is any split's template, and they ask in ways the train templates do not.
FRESH_TEMPLATES: dict[str, tuple[str, ...]] = {
    "weather": ("What's the forecast like in {city} for {date}?", "Give me {city}'s weather on {date}."),
    "air": ("How polluted is {city} right now?", "Give me the current air quality reading for {city}."),
    "stock": ("What does one share of {symbol} cost?", "Give me the latest {symbol} quote."),
    "flight": ("Any flights going {origin} to {destination} on {date}?", "Get me flight options from {origin} to {destination}, {date}."),
    "restaurant": ("Any good {cuisine} spots in {city}?", "Suggest somewhere serving {cuisine} cuisine in {city}."),
    "convert": ("{amount} {src} is how many {dst}?", "Work out {amount} {src} in {dst} for me."),
    "event": ("Block {date} for {title}.", "Pencil in {title} on {date}."),
    "weather2": ("Compare the forecasts of {city1} and {city2} for {date}.", "Give me {city1}'s and {city2}'s weather on {date}."),
    "stock2": ("What do {s1} and {s2} shares cost?", "Give me quotes for {s1} and {s2}."),
    "air2": ("How polluted are {city1} and {city2} right now?", "Give me the air quality readings for {city1} and {city2}."),
    "weather_air": ("For {city} on {date}: the forecast, and how polluted is it?", "Give me {city}'s weather on {date} plus its air quality."),
    "weather_stock": ("Two things: {city}'s forecast for {date}, and a {symbol} quote.", "Give me {city}'s weather on {date} and what {symbol} costs."),
    "flight_book": ("Get {passenger} onto a {date} flight from {origin} to {destination}.", "Reserve a seat for {passenger}, {origin} to {destination}, on {date}."),
    "stock_convert": ("What does {symbol} cost in {dst}?", "Give me the {symbol} share price converted to {dst}."),
    "restaurant_book": ("Reserve {cuisine} for {people} in {city} on {date}.", "Get a table for {people} at a {cuisine} spot in {city} on {date}."),
    "event_list": ("Pencil in {title} on {date}, then tell me everything I have that day.", "Block {date} for {title} and list that day's events."),
    "greet": ("Hey there, {name} here.", "Just saying hello, I'm {name}."),
    "add": ("Add up {a} and {b} for me.", "{a} and {b} together make what?"),
    "taxi": ("Get me a cab in {city}.", "I need a car to pick me up in {city}."),
    "email": ("Write {name} a message in their inbox.", "Mail {name} for me."),
    "music": ("Put some songs on.", "I'd like to hear some tunes."),
    "pizza": ("Get a pizza delivered in {city}.", "Have some pizza sent over in {city}."),
}
"""The request phrasings of the ``fresh`` split, by task type (training tools only)."""


def _templates(tt: _TaskType, split: str) -> tuple[str, ...]:
    if split == "fresh":
        return FRESH_TEMPLATES[tt.name]
    if tt.heldout:
        return tt.templates
    return tt.templates[:4] if split in _TRAIN_PHRASING else tt.templates[4:]


def request_templates(split: str) -> dict[str, tuple[str, ...]]:
    """The request templates a ``split`` phrases each of its task types with (``{slot}`` placeholders), by task type."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return {tt.name: _templates(tt, split) for tt in _TYPES if tt.heldout == (split == "heldout_tools")}


@functools.lru_cache(maxsize=4)
def _seen_requests(seed: int) -> frozenset[str]:
    """Request texts ``train_heldout`` leaves out: the warm start's demonstrations and the RL pool of ``seed``."""
    n_demo, demo_seed = WARMSTART_DEMOS
    tasks = make_tasks("train", n=n_demo, seed=demo_seed)
    if seed != demo_seed:  # the pool of the demonstrations' seed is their prefix (same stream)
        tasks += make_tasks("train", seed=seed)
    return frozenset(t.messages[0]["content"] for t in tasks)


def _offered_tools(rng: random.Random, gold: list[list[ToolCall]], pool: list[str], n_distract: int) -> list[dict[str, Any]]:
    """The gold tools plus ``n_distract`` others from ``pool``, in the pool's order."""
    used = {c.name for step in gold for c in step}
    others = [n for n in pool if n not in used]
    chosen = used | set(rng.sample(others, min(n_distract, len(others))))
    return [_BY_NAME[n] for n in pool if n in chosen]


def make_tasks(split: str = "train", n: int | None = None, seed: int = 0, *, kinds: Sequence[str] | None = None) -> list[Task]:
    """Generate ``n`` toolworld tasks of ``split`` deterministically from ``seed``.

    Args:
        split: one of :data:`SPLITS` (see the module docstring).
        n: number of tasks (default 2000 train, 600 train_heldout, 300 for the test
            splits and fresh, 200 heldout_tools). ``train_heldout`` may return fewer when every
            kind's unseen requests run out (it has several thousand).
        seed: generator seed; the same (split, n, seed, kinds) gives the same tasks.
        kinds: only these task kinds (e.g. ``["parallel"]`` for the diagnostic
            case), in their usual proportions; default all kinds of the split.

    Returns:
        Tasks with ``gold`` (steps of parallel calls), ``kind``, ``answer_facts``,
        ``reference_answer``, ``refusal`` and ``meta`` (``suite``, ``split``,
        ``task_type``, ``template``, ``entities``).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    n = _DEFAULT_N[split] if n is None else n
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    rng = random.Random(_h("toolworld", split, seed))
    E = _split_entities(split)
    heldout = split == "heldout_tools"
    types = [t for t in _TYPES if t.heldout == heldout]
    by_kind: dict[str, list[_TaskType]] = {}
    for t in types:
        by_kind.setdefault(t.kind, []).append(t)
    if kinds is not None:
        if isinstance(kinds, str) or not set(kinds) <= set(by_kind) or not kinds:
            raise ValueError(f"kinds must be a non-empty list drawn from {sorted(by_kind)} for split {split!r}, got {kinds!r}")
        by_kind = {k: v for k, v in by_kind.items() if k in kinds}
    kind_names = list(by_kind)
    pool = _HELDOUT_TOOL_NAMES if heldout else _TRAIN_TOOL_NAMES
    # a request already seen (demonstrations, RL pool, this split) is drawn again; the two diagnostic
    # splits share train's entities or phrasings, so requests with no entity would repeat train's
    seen = set(_seen_requests(seed)) if split in _DEDUPED and n else None
    tasks: list[Task] = []
    while len(tasks) < n and kind_names:
        i = len(tasks)
        kind = rng.choices(kind_names, [_KIND_WEIGHTS[k] for k in kind_names])[0]
        for _ in range(_MAX_DRAWS if seen is not None else 1):
            tt = rng.choice(by_kind[kind])
            template = rng.choice(_templates(tt, split))
            draw = tt.build(rng, E, _probe())  # a fresh world per draw: stateful tools start empty
            request = template.format(**draw.slots)
            if seen is None or request not in seen:
                break
        else:  # no unseen request of this kind in _MAX_DRAWS draws: exhausted
            kind_names.remove(kind)
            continue
        if seen is not None:
            seen.add(request)
        tools = _offered_tools(rng, draw.gold, pool, 1 if draw.gold else 2)
        task = Task(
            id=f"toolworld-{split}-{seed}-{i:05d}",
            messages=[{"role": "user", "content": request}],
            tools=tools,
            gold=draw.gold,
            kind=kind,
            answer_facts=draw.facts,
            meta={"suite": "toolworld", "split": split, "task_type": tt.name, "template": template, "entities": draw.entities},
            reference_answer=draw.answer,
            refusal=kind == "unservable",
        )
        tasks.append(task)
    return tasks
