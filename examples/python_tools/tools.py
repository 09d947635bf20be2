"""Your own tools for ``slca train``: plain Python functions (docs/training.md, "Your own tools").

Each function is a tool; its schema comes from the signature and the Google-style
docstring (``transformers.utils.get_json_schema``, as TRL builds the schemas of
``GRPOTrainer(tools=[...])``), so the same functions serve TRL too. A tool refuses
a call by raising ``ValueError`` (the model reads ``"<tool> failed: <message>"``);
any other exception is a bug: the model reads ``"<tool> raised <Type>: <message>"``
and the run logs the first traceback once.

    slca train --set suite=examples/python_tools/tasks.jsonl --set tools=examples/python_tools/tools.py \
        --set eval_fraction=0.25 --set steps=2 --set run_dir=runs/my-tools
"""

from __future__ import annotations

WEATHER = {
    "paris": {"condition": "sunny", "celsius": 18},
    "oslo": {"condition": "snow", "celsius": -3},
    "lima": {"condition": "cloudy", "celsius": 21},
    "cairo": {"condition": "clear", "celsius": 31},
}


def get_weather(city: str) -> dict:
    """Get the current weather of a city.

    Args:
        city: The city name, e.g. Paris.
    """
    w = WEATHER.get(city.strip().lower())
    if w is None:
        raise ValueError(f"no weather station in {city!r}; known cities: {sorted(WEATHER)}")
    return {"city": city, **w}


def convert_temperature(celsius: float, unit: str) -> dict:
    """Convert a temperature given in degrees Celsius.

    Args:
        celsius: The temperature in degrees Celsius.
        unit: The unit to convert to. (choices: ["fahrenheit", "kelvin"])
    """
    value = celsius * 9 / 5 + 32 if unit == "fahrenheit" else celsius + 273.15
    return {"value": round(value, 1), "unit": unit}
