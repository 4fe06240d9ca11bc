"""The os domain's text: the world model's system prompt and long guidance, the agent's view of
the world and the judge's guidance (read through the domain record, `lwm_jax.domains`)."""

# The system prompt's parts: what is simulated, what an observation is, the default action space
# and demonstration, and the domain's rules, most important first (lwm_jax/data/prompts.py).
PROMPT = dict(
    role="a desktop operating system with windowed applications",
    obs="the focused window and desktop as an accessibility tree in text",
    actions="click(target), double_click(target), type(text), hotkey(keys), scroll(direction).",
    demo="Action: hotkey(ctrl+s)\nObservation: dialog 'Save As': name field empty",
    rules=[
        "Report which window has focus and the elements it shows.",
        "Keyboard shortcuts do what the focused application does with them.",
        "Files saved or deleted persist in later file dialogs and file managers.",
        "Dialogs block their window until answered.",
        "Menus open and close as in the real application.",
        "Text typed appears in the focused field exactly.",
        "Window titles change with the open document's name.",
        "Never describe pixels; describe elements and their states.",
    ])

# The long prompts' guidance: (heading, points) groups, most important first (data/guidance.py).
GUIDANCE = [
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
]

# What the agent acts on (data/agent_targets.py).
AGENT_WORLD = "a desktop with a file manager, a text editor and a settings window"

# The judge's paragraph about this domain's observations (lwm_jax/judge.py).
JUDGE_GUIDANCE = ("Environment: a desktop operating system. Observations are the accessibility tree of "
                  "windows and applications as text. Judge the tree's structure, which windows, dialogs, "
                  "menus and files exist after the action, and their names and states; elements kept "
                  "from earlier turns must keep their ids and order.")
