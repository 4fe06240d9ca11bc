"""Detailed simulation guidance for the long system-prompt variants (v2-v11, SFT).

Per domain, guidance is a list of (heading, points) groups, most important first; `GENERAL` holds
groups that apply to every domain. A variant includes the first N groups of its domain (N grows
with the variant number) and, in the longest variants, the general groups too. The text is ours;
it describes how each of our environments behaves so that a world model can imitate it.
"""
from __future__ import annotations

Group = tuple[str, list[str]]

DOMAIN: dict[str, list[Group]] = {
    "terminal": [
        ("Shell state", [
            "Track the working directory after every cd, pushd and popd; relative paths resolve "
            "against it.",
            "Shell variables, aliases and functions defined in one turn exist in later turns; "
            "exported ones are also seen by child programs.",
            "Files created, appended to, moved or deleted change what later ls, cat, find and wc "
            "show, byte for byte.",
            "A background job (`cmd &`) prints its job number and PID at once; its output may "
            "arrive in a later turn.",
            "The exit status of the last command is what `$?` prints next.",
        ]),
        ("Program output", [
            "coreutils print in their usual columns: `wc` right-aligns counts, `ls -l` shows "
            "permissions, links, owner, group, size, date and name.",
            "`sort` orders by the C locale unless told otherwise: uppercase before lowercase, "
            "digits before letters.",
            "`grep` prints matching lines only; with -n it prefixes line numbers, with -c it "
            "prints a count, with several files it prefixes file names.",
            "`head` and `tail` default to 10 lines; `-n N` changes that.",
            "`python3 -c` prints what the program prints; an exception prints a traceback ending "
            "with the exception type and message.",
            "`find` lists paths starting with the directory given, in directory order, one a line.",
        ]),
        ("Errors and limits", [
            "A missing file gives `prog: name: No such file or directory` on stderr.",
            "An unknown command gives `bash: name: command not found`.",
            "A command that runs past the time limit is killed; show what the shell shows for it.",
            "Syntax errors in the command line are reported by bash with the offending token.",
            "Writing to a read-only location gives `Permission denied`.",
        ]),
        ("Prompt and echo", [
            "Show the prompt line the session shows after each command when the recorded "
            "observations include it, and never otherwise.",
            "Never repeat the command itself unless the program echoes it (as `set -x` does).",
        ]),
    ],
    "mcp": [
        ("Tool calls", [
            "Each action is one JSON object naming a tool and its arguments; the reply is that "
            "tool's result only.",
            "A call to a tool that is not in the declared list returns the server's unknown-tool "
            "error.",
            "A request that is not valid JSON returns a parse error with a JSON-RPC error code.",
            "Missing or mistyped arguments return a validation error that names the argument.",
        ]),
        ("Results", [
            "Read tools return rows or objects with the same keys and types each time.",
            "A query returns exactly the rows its filter selects, in the order it asks for.",
            "Writes (orders, refunds, updates) return the changed record or its new id, and every "
            "later read reflects them.",
            "Identifiers the server assigns count up from the largest existing one.",
            "Constraint violations (stock, uniqueness, foreign keys) fail the whole call with the "
            "database's error message inside an error result.",
        ]),
        ("Consistency", [
            "Totals and prices follow from quantities and unit prices shown earlier.",
            "A record deleted or refunded stays in that state for the rest of the episode.",
            "Empty results are an empty list, not an error.",
        ]),
    ],
    "search": [
        ("Result lists", [
            "A search returns a numbered list of documents, best match first, each with its id "
            "and a one-line summary.",
            "Matching is on words of the query; documents that use more of them rank higher.",
            "A query that matches nothing says so in one line.",
            "The same query returns the same list every time.",
        ]),
        ("Opened documents", [
            "Opening a document shows its title line and its text page by page; the header says "
            "which page of how many is shown.",
            "A page past the last one, or an id that does not exist, is an error line naming the "
            "id and what is available.",
            "The text of a page is the real documentation text of the named object: signature, "
            "description and notes.",
        ]),
        ("Faithfulness", [
            "Facts in results must be true of the documented library version.",
            "Never invent ids: use ids that earlier results showed or that follow their pattern.",
            "Summaries are the first sentence of the document, not a paraphrase.",
        ]),
    ],
    "swe": [
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
    ],
    "android": [
        ("Screens", [
            "Each observation is the whole view hierarchy of the current screen, one node a "
            "line, children indented under their parent.",
            "The status bar node (time, connectivity) is present on every screen.",
            "Clickable nodes carry their numeric ids; the same screen keeps the same ids.",
        ]),
        ("Navigation", [
            "Tapping an app icon opens that app's main screen; back returns to the previous "
            "screen; home returns to the launcher.",
            "Text typed goes into the focused field and stays there until the screen changes.",
            "Toggles and checkboxes flip their checked state when tapped.",
            "Saving a form returns to the list it came from, now showing the new entry.",
        ]),
        ("Invalid actions", [
            "Tapping an id that is not on the screen changes nothing and the same screen is "
            "shown with an error note.",
            "Swiping past the end of a list leaves it where it is.",
        ]),
    ],
    "web": [
        ("Pages", [
            "Each observation is the page's accessibility tree: a title line with the URL, then "
            "landmarks and their elements, interactive ones numbered in brackets.",
            "Numbers are assigned top to bottom on each page; a new page renumbers.",
            "Form fields show their current value.",
        ]),
        ("Site behaviour", [
            "Links lead to the pages of the same site; the URL in the title line changes with "
            "them.",
            "Search forms list the matching products with names and prices.",
            "The cart counts items added so far; the checkout needs a logged-in user and "
            "redirects to the login page otherwise.",
            "Submitting a form with a missing or wrong value shows the site's error message on "
            "the same page.",
        ]),
        ("Navigation errors", [
            "Going to a site that is not served shows an error line before the current page.",
            "Going back with no history says there is no previous page.",
        ]),
    ],
    "os": [
        ("Windows", [
            "Each observation lists the open window's title and application, then its "
            "toolbar, content and the dock, elements numbered in brackets.",
            "Only the focused window's elements are shown, with how many windows are open.",
        ]),
        ("File manager and editor", [
            "The file manager lists the folder's items with their type; opening a folder shows "
            "its items; Up goes to the parent folder.",
            "Creating, renaming and deleting items updates the list at once.",
            "The editor shows the file name in its title and the text area's content; saving "
            "writes it, and the file manager then shows the file.",
        ]),
        ("Settings and errors", [
            "Settings pages show each option with its current value; changes persist.",
            "Clicking an id that is not shown leaves the window as it was, with an error note.",
        ]),
    ],
}

GENERAL: list[Group] = [
    ("How to read the history", [
        "Every earlier observation is ground truth about the environment at that moment.",
        "The initial state describes the world before the first action; build on it.",
        "When two observations seem to disagree, the later one reflects a change of state: "
        "find the action that caused it.",
        "Demonstrations come from other episodes of the same environment: copy their formats, "
        "not their contents.",
    ]),
    ("How to write the observation", [
        "Write only what the environment would output after this action, in its own format.",
        "Keep every whitespace convention the environment has shown: indentation, blank lines, "
        "column alignment.",
        "Do not summarise, shorten with ellipses, or add notes about what you are doing.",
        "When a value cannot be known from the history, choose a plausible one and keep it fixed "
        "for the rest of the episode.",
    ]),
    ("Reasoning before the answer", [
        "Name the state the action touches and what the history says about it.",
        "Decide whether the action succeeds, fails, or partly succeeds, and why.",
        "Check the simulation instruction for anything it forces on this turn.",
        "Then write the observation in full.",
    ]),
]


def groups(domain: str, n_domain: int, general: bool) -> list[Group]:
  """The first `n_domain` guidance groups of `domain`, then the general ones when asked."""
  return DOMAIN[domain][:n_domain] + (GENERAL if general else [])


def render(gs: list[Group]) -> str:
  """Groups as text: a heading line, then one `- point` line each."""
  return "\n\n".join(f"{head}:\n" + "\n".join(f"- {p}" for p in points) for head, points in gs)
