"""tools/structured_schemas.py — 50 JSON Schemas with a prompt each, for the structured-output checks
(tools/serve_e2e.py: every answer must parse and validate with `jsonschema`) and for the constrained
decoding benchmark (tools/bench_structured.py). Strings and arrays are bounded so answers end within
the requests' max_tokens; the schemas span nested objects, arrays, enums, bounded numbers, optional
fields, anyOf, type unions, const, $defs references.

Also UNSUPPORTED: schemas the grammar refuses, with the keyword the 400 must name.
"""

S = {"type": "string", "maxLength": 40}
SHORT = {"type": "string", "maxLength": 16}


def obj(props, required=None, **extra):
    o = {"type": "object", "properties": props, "required": list(props) if required is None else required}
    o.update(extra)
    return o


def arr(items, lo=0, hi=4):
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


SCHEMAS = [
    ("person", "Describe a fictional person.", obj({"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("book", "Recommend a classic novel.", obj({"title": S, "author": S, "year": {"type": "integer", "minimum": 1500, "maximum": 2025}})),
    ("city", "Tell me about Paris.", obj({"city": SHORT, "country": SHORT, "population_millions": {"type": "number", "minimum": 0, "maximum": 50}})),
    ("weather", "What's the weather like in a desert at noon?", obj({"temperature_c": {"type": "number", "minimum": -60, "maximum": 60}, "condition": {"enum": ["sunny", "cloudy", "rainy", "windy"]}})),
    ("todo", "Make a short todo list for moving house.", obj({"items": arr(SHORT, 1, 4)})),
    ("sentiment", "Classify the sentiment of: 'I love this phone, the battery is great.'", obj({"label": {"enum": ["positive", "negative", "neutral"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}})),
    ("recipe", "Give a simple pancake recipe.", obj({"dish": SHORT, "ingredients": arr(SHORT, 2, 4), "minutes": {"type": "integer", "minimum": 1, "maximum": 120}})),
    ("address", "Invent a postal address.", obj({"street": S, "number": {"type": "integer", "minimum": 1, "maximum": 9999}, "zip": {"type": "string", "minLength": 4, "maxLength": 6}, "city": SHORT})),
    ("movie", "Describe a science fiction movie.", obj({"title": S, "genres": arr({"enum": ["sci-fi", "drama", "action", "comedy", "horror"]}, 1, 3), "rating": {"type": "number", "minimum": 0, "maximum": 10}})),
    ("point", "Give a point in the unit square.", obj({"x": {"type": "number", "minimum": 0, "maximum": 1}, "y": {"type": "number", "minimum": 0, "maximum": 1}})),
    ("boolean_flags", "Is the sky blue, and is fire cold?", obj({"sky_is_blue": {"type": "boolean"}, "fire_is_cold": {"type": "boolean"}})),
    ("optional_fields", "Describe a pet; the nickname is optional.", obj({"species": SHORT, "nickname": SHORT, "legs": {"type": "integer", "minimum": 0, "maximum": 8}}, required=["species"])),
    ("nested_company", "Describe a small company and its CEO.", obj({"company": obj({"name": S, "employees": {"type": "integer", "minimum": 1, "maximum": 100000}}), "ceo": obj({"name": S, "age": {"type": "integer", "minimum": 18, "maximum": 100}})})),
    ("order", "Create an order for two products.", obj({"order_id": SHORT, "lines": arr(obj({"sku": SHORT, "qty": {"type": "integer", "minimum": 1, "maximum": 10}}), 1, 3)})),
    ("nullable", "Give a middle name if the person has one: John Smith.", obj({"first": SHORT, "middle": {"type": ["string", "null"], "maxLength": 16}, "last": SHORT})),
    ("any_of_contact", "Give a way to contact support.", obj({"contact": {"anyOf": [obj({"email": S}), obj({"phone": SHORT})]}})),
    ("const_version", "Report the API version information.", obj({"version": {"const": "v1"}, "build": {"type": "integer", "minimum": 0, "maximum": 1000}})),
    ("enum_numbers", "Pick a dice value.", obj({"die": {"enum": [1, 2, 3, 4, 5, 6]}})),
    ("defs_ref", "Describe two people who are friends.", {"type": "object", "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"$ref": "#/$defs/p"}}, "required": ["a", "b"], "$defs": {"p": obj({"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 120}})}}),
    ("matrix", "Give a 2x2 matrix of small integers.", obj({"rows": arr(arr({"type": "integer", "minimum": -9, "maximum": 9}, 2, 2), 2, 2)})),
    ("translation", "Translate 'good morning' into French and Spanish.", obj({"fr": S, "es": S})),
    ("math_answer", "What is 12 times 7? Show the result.", obj({"expression": SHORT, "result": {"type": "integer"}})),
    ("event", "Plan a birthday party.", obj({"title": S, "day": {"enum": ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]}, "guests": {"type": "integer", "minimum": 1, "maximum": 50}})),
    ("color", "Give a color as RGB.", obj({"name": SHORT, "r": {"type": "integer", "minimum": 0, "maximum": 255}, "g": {"type": "integer", "minimum": 0, "maximum": 255}, "b": {"type": "integer", "minimum": 0, "maximum": 255}})),
    ("exclusive_bounds", "Give a probability strictly between 0 and 1.", obj({"p": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}})),
    ("negative_range", "Give a temperature below freezing in Celsius.", obj({"celsius": {"type": "number", "minimum": -90, "exclusiveMaximum": 0}})),
    ("tags", "Tag this article about electric cars.", obj({"tags": arr({"type": "string", "maxLength": 12}, 1, 4)})),
    ("key_value", "List some settings as key/value pairs.", obj({"settings": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 100}, "minProperties": 1, "maxProperties": 4}})),
    ("empty_allowed", "List known bugs (there may be none).", obj({"bugs": arr(SHORT, 0, 3)})),
    ("planet", "Describe Mars.", obj({"planet": SHORT, "moons": {"type": "integer", "minimum": 0, "maximum": 100}, "has_rings": {"type": "boolean"}})),
    ("quiz", "Write a multiple choice question about geography.", obj({"question": {"type": "string", "maxLength": 60}, "choices": arr(SHORT, 2, 4), "answer_index": {"type": "integer", "minimum": 0, "maximum": 3}})),
    ("stock", "Give a stock quote.", obj({"ticker": {"type": "string", "minLength": 1, "maxLength": 5}, "price": {"type": "number", "minimum": 0, "maximum": 10000}, "currency": {"enum": ["USD", "EUR", "GBP"]}})),
    ("deep_nesting", "Describe a file in a folder in a drive.", obj({"drive": obj({"folder": obj({"file": obj({"name": SHORT, "size_kb": {"type": "integer", "minimum": 0, "maximum": 100000}})})})})),
    ("union_types", "Give an id, as a number or a string.", obj({"id": {"type": ["integer", "string"], "maxLength": 10, "minimum": 0, "maximum": 1000000}})),
    ("anyof_shapes", "Describe a geometric shape.", obj({"shape": {"anyOf": [obj({"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0, "maximum": 100}}), obj({"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0, "maximum": 100}})]}})),
    ("email_list", "List the team's emails.", obj({"emails": arr(S, 1, 3)})),
    ("timeline", "Give three events in the history of computing.", obj({"events": arr(obj({"year": {"type": "integer", "minimum": 1800, "maximum": 2025}, "event": S}), 1, 3)})),
    ("review", "Review a restaurant.", obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "summary": {"type": "string", "maxLength": 60}, "would_return": {"type": "boolean"}})),
    ("flight", "Book a flight from Oslo to Rome.", obj({"from": {"type": "string", "minLength": 3, "maxLength": 3}, "to": {"type": "string", "minLength": 3, "maxLength": 3}, "passengers": {"type": "integer", "minimum": 1, "maximum": 9}, "class": {"enum": ["economy", "business", "first"]}})),
    ("inventory", "List items in a warehouse with counts.", obj({"items": arr(obj({"name": SHORT, "count": {"type": "integer", "minimum": 0, "maximum": 1000}, "fragile": {"type": "boolean"}}, required=["name", "count"]), 1, 3)})),
    ("no_type_object", "Describe a lamp.", {"properties": {"watts": {"type": "integer", "minimum": 1, "maximum": 500}, "color": SHORT}, "required": ["watts"]}),
    ("allof_single", "Describe a car.", {"allOf": [obj({"make": SHORT, "model": SHORT})]}),
    ("array_root_in_object", "List three prime numbers.", obj({"primes": arr({"type": "integer", "minimum": 2, "maximum": 100}, 3, 3)})),
    ("mixed_enum", "Choose an answer: yes, no, or a number of votes.", obj({"answer": {"enum": ["yes", "no", 0, 1, 2, None, True]}})),
    ("scores", "Give test scores for three students.", obj({"scores": arr({"type": "number", "minimum": 0, "maximum": 100}, 3, 3), "passed": {"type": "boolean"}})),
    ("profile_optional_nested", "Create a user profile; the address is optional.", obj({"username": SHORT, "address": obj({"city": SHORT, "zip": SHORT})}, required=["username"])),
    ("units", "Convert 5 kilometres into miles.", obj({"km": {"type": "number", "minimum": 0, "maximum": 1000}, "miles": {"type": "number", "minimum": 0, "maximum": 1000}})),
    ("status", "What is the status of the build?", obj({"status": {"enum": ["queued", "running", "passed", "failed"]}, "progress": {"type": "integer", "minimum": 0, "maximum": 100}})),
    ("language", "Which programming language is best for data science, and why?", obj({"language": SHORT, "reasons": arr(S, 1, 3)})),
    ("title_case", "Suggest a title for a blog post about gardening.", obj({"title": {"type": "string", "minLength": 5, "maxLength": 50}})),
]

UNSUPPORTED = [
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}, "pattern"),
    ({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}}, "format"),
    ({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5}}}, "multipleOf"),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "oneOf"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}},
     "recursive"),
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                        "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number", "minimum": -1000, "maximum": 1000},
                                                        "b": {"type": "number", "minimum": -1000, "maximum": 1000}},
                       "required": ["a", "b"]}}},
]

assert len(SCHEMAS) == 50, len(SCHEMAS)

# A second set the benchmark also reports (written after the settings were fixed, never tuned on):
# other domains, longer free strings, more optional fields and unions.
HELDOUT = [
    ("bug_report", "File a bug report about a login page that crashes.", obj({"title": S, "severity": {"enum": ["low", "medium", "high", "critical"]}, "steps": arr({"type": "string", "maxLength": 60}, 1, 4)})),
    ("invoice", "Write an invoice for web design work.", obj({"client": S, "lines": arr(obj({"item": S, "hours": {"type": "number", "minimum": 0, "maximum": 200}, "rate": {"type": "number", "minimum": 0, "maximum": 500}}), 1, 3), "paid": {"type": "boolean"}})),
    ("song", "Describe a folk song.", obj({"title": S, "verses": {"type": "integer", "minimum": 1, "maximum": 12}, "mood": {"enum": ["happy", "sad", "calm", "angry"]}, "chorus": {"type": "string", "maxLength": 80}})),
    ("lab_result", "Report a blood test result.", obj({"test": SHORT, "value": {"type": "number", "minimum": 0, "maximum": 1000}, "unit": SHORT, "in_range": {"type": "boolean"}})),
    ("trip", "Plan a weekend trip to the mountains.", obj({"destination": S, "nights": {"type": "integer", "minimum": 1, "maximum": 3}, "packing": arr(SHORT, 2, 4), "budget_eur": {"type": "number", "minimum": 0, "maximum": 5000}})),
    ("chess_move", "Suggest a strong opening move in chess.", obj({"move": {"type": "string", "minLength": 2, "maxLength": 6}, "piece": {"enum": ["pawn", "knight", "bishop", "rook", "queen", "king"]}, "reason": {"type": "string", "maxLength": 80}})),
    ("library", "Describe a library branch.", obj({"name": S, "books": {"type": "integer", "minimum": 0, "maximum": 1000000}, "open_days": arr({"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]}, 1, 7)})),
    ("sensor", "Give a reading from a humidity sensor.", obj({"sensor_id": SHORT, "humidity": {"type": "number", "minimum": 0, "maximum": 100}, "battery": {"type": ["integer", "null"], "minimum": 0, "maximum": 100}})),
    ("course", "Describe an online course about statistics.", obj({"title": S, "weeks": {"type": "integer", "minimum": 1, "maximum": 52}, "level": {"enum": ["beginner", "intermediate", "advanced"]}, "topics": arr(S, 1, 4)})),
    ("vehicle", "Describe a delivery van.", obj({"make": SHORT, "capacity_kg": {"type": "integer", "minimum": 100, "maximum": 5000}, "electric": {"type": "boolean"}, "range_km": {"type": "number", "minimum": 0, "maximum": 1000}}, required=["make", "electric"])),
    ("meeting", "Summarise a project meeting.", obj({"topic": S, "attendees": arr(SHORT, 1, 4), "decisions": arr({"type": "string", "maxLength": 60}, 0, 3), "next_meeting_in_days": {"type": "integer", "minimum": 1, "maximum": 30}})),
    ("garden", "Plan a vegetable garden bed.", obj({"plants": arr(obj({"name": SHORT, "rows": {"type": "integer", "minimum": 1, "maximum": 10}}), 1, 3), "sunny": {"type": "boolean"}})),
    ("password_policy", "Describe a password policy.", obj({"min_length": {"type": "integer", "minimum": 6, "maximum": 64}, "needs_digit": {"type": "boolean"}, "needs_symbol": {"type": "boolean"}, "expiry_days": {"type": ["integer", "null"], "minimum": 0, "maximum": 365}})),
    ("galaxy", "Describe the Andromeda galaxy.", obj({"name": S, "type": {"enum": ["spiral", "elliptical", "irregular"]}, "distance_mly": {"type": "number", "minimum": 0, "maximum": 100000}})),
    ("feedback", "Give feedback on an essay.", obj({"score": {"type": "integer", "minimum": 0, "maximum": 100}, "strengths": arr(S, 1, 3), "weaknesses": arr(S, 0, 3)})),
    ("payment", "Describe a card payment.", obj({"amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 100000}, "currency": {"enum": ["USD", "EUR", "JPY"]}, "method": {"anyOf": [obj({"card_last4": {"type": "string", "minLength": 4, "maxLength": 4}}), obj({"iban": S})]}})),
    ("hike", "Describe a hiking trail.", obj({"trail": S, "length_km": {"type": "number", "minimum": 0, "maximum": 100}, "difficulty": {"enum": ["easy", "moderate", "hard"]}, "dog_friendly": {"type": "boolean"}})),
    ("server_config", "Give settings for a web server.", obj({"host": SHORT, "port": {"type": "integer", "minimum": 1, "maximum": 65535}, "tls": {"type": "boolean"}, "workers": {"type": "integer", "minimum": 1, "maximum": 64}})),
    ("poem", "Write a very short poem about rain.", obj({"title": SHORT, "lines": arr({"type": "string", "maxLength": 50}, 2, 4)})),
    ("election", "Report results of a small club election.", obj({"winner": S, "votes": arr(obj({"candidate": SHORT, "count": {"type": "integer", "minimum": 0, "maximum": 1000}}), 2, 3), "turnout_pct": {"type": "number", "minimum": 0, "maximum": 100}})),
]
