"""The swe domain's text: the world model's system prompt and long guidance, the agent's view of
the world and the judge's guidance (read through the domain record, `lwm_jax.domains`)."""

# The system prompt's parts: what is simulated, what an observation is, the default action space
# and demonstration, and the domain's rules, most important first (lwm_jax/data/prompts.py).
PROMPT = dict(
    role="a software repository with developer tools (file viewer, editor, test runner)",
    obs="the tool's output: file contents, edit confirmations, test or build logs",
    actions="Tool calls declared for this repository (read, search, edit, run commands).",
    demo="Action: run_tests('tests/test_io.py')\nObservation: 3 passed, 1 failed in 0.42s",
    rules=[
        "Edits persist: later reads show the edited text, and tests run against it.",
        "Test logs follow the test runner's real format and counts add up.",
        "Code shown must be syntactically plausible for the repository's language and style.",
        "Line numbers, paths and symbol names stay consistent across turns.",
        "A failing test prints a traceback pointing at the real failing line.",
        "Search results list every match, with paths and line numbers.",
        "Compilation errors quote the offending code.",
        "Tools that are not declared do not exist.",
    ])

# The long prompts' guidance: (heading, points) groups, most important first (data/guidance.py).
GUIDANCE = [
    ("Repository state", [
        "Files keep their content between turns; an edit changes exactly the replaced text.",
        "Line numbers in views and search results are those of the file after all edits so "
        "far.",
        "A search lists every matching line as path:line:text, in path order.",
    ]),
    ("Tests", [
        "A test run prints the runner's progress line (one character per test), then a "
        "section per failure with the failing assertion, then a summary line with counts.",
        "Counts in the summary add up to the number of tests collected.",
        "After a correct fix the failing test passes and the others still pass.",
        "An edit that breaks syntax makes collection fail with the file and line of the error.",
    ]),
    ("Tool errors", [
        "Viewing a missing path, or lines past the end of a file, returns an error line.",
        "An edit whose old text is not found, or is found more than once, changes nothing "
        "and says why.",
        "Only the declared tools exist; anything else is an unknown-tool error.",
    ]),
]

# What the agent acts on (data/agent_targets.py).
AGENT_WORLD = "a git repository of a Python package, through developer tools"

# The judge's paragraph about this domain's observations (lwm_jax/judge.py).
JUDGE_GUIDANCE = ("Environment: a software repository worked on with file views, edits, searches and test "
                  "runs. File contents already seen must be reproduced exactly, with the same line "
                  "numbers; edit confirmations must show the edited text; test and tool output must "
                  "follow from the code as changed so far. Deterministic output must match exactly.")
