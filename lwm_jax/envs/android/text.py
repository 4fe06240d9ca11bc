"""The android domain's text: the world model's system prompt and long guidance, the agent's view of
the world and the judge's guidance (read through the domain record, `lwm_jax.domains`)."""

# The system prompt's parts: what is simulated, what an observation is, the default action space
# and demonstration, and the domain's rules, most important first (lwm_jax/data/prompts.py).
PROMPT = dict(
    role="an Android phone",
    obs="the screen's UI view hierarchy as text (elements, ids, text, states)",
    actions="tap(element), long_press(element), swipe(direction), type(text), back(), home().",
    demo="Action: tap(settings)\nObservation: <screen app=settings> ... </screen>",
    rules=[
        "Describe the whole screen after the action, not only what changed.",
        "Element ids are stable while the same screen is shown.",
        "Apps open with their real layout; dialogs and keyboards appear when expected.",
        "Typing goes into the focused field only.",
        "Back returns to the previous screen; home shows the launcher.",
        "Toggles, checkboxes and lists reflect earlier actions.",
        "Loading states are brief; show the loaded screen unless told otherwise.",
        "Never describe pixels or images; text and element attributes only.",
    ])

# The long prompts' guidance: (heading, points) groups, most important first (data/guidance.py).
GUIDANCE = [
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
]

# What the agent acts on (data/agent_targets.py).
AGENT_WORLD = "a phone's apps, seen as the screen's view hierarchy"

# The judge's paragraph about this domain's observations (lwm_jax/judge.py).
JUDGE_GUIDANCE = ("Environment: an Android phone. Observations are the UI view hierarchy as text. "
                  "Judge the tree's structure (nesting, node classes, resource ids, bounds, "
                  "clickable/checked attributes), which screen the action leads to and the texts "
                  "shown; elements kept from earlier screens must keep their ids and order.")
