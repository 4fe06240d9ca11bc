"""The web domain's text: the world model's system prompt and long guidance, the agent's view of
the world and the judge's guidance (read through the domain record, `lwm_jax.domains`)."""

# The system prompt's parts: what is simulated, what an observation is, the default action space
# and demonstration, and the domain's rules, most important first (lwm_jax/data/prompts.py).
PROMPT = dict(
    role="a web browser showing real websites",
    obs="the page's accessibility tree as text: numbered elements with roles and labels",
    actions="click(id), type(id, text), scroll(direction), goto(url), go_back().",
    demo="Action: click(4)\nObservation: [page] Product page\n[6] button 'Add to cart'",
    rules=[
        "Element numbers are valid for the page shown; a new page may renumber them.",
        "Forms keep typed values until submitted or the page changes.",
        "Navigation follows the site's real structure and URLs.",
        "Carts, logins and settings persist during the session.",
        "Show dynamic content (banners, counters, errors) after actions that trigger it.",
        "Scrolling reveals further elements of the same page.",
        "Prices, names and counts stay consistent across pages.",
        "Never describe pixels; the accessibility tree only.",
    ])

# The long prompts' guidance: (heading, points) groups, most important first (data/guidance.py).
GUIDANCE = [
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
]

# What the agent acts on (data/agent_targets.py).
AGENT_WORLD = "a web shop, seen as the browser's accessibility tree"

# The judge's paragraph about this domain's observations (lwm_jax/judge.py).
JUDGE_GUIDANCE = ("Environment: a web browser. Observations are the page's accessibility tree as text "
                  "(roles, names, values, element ids), sometimes with URL and title. Judge the tree's "
                  "structure, the page the action leads to, entered form values and focus; elements kept "
                  "from earlier pages must keep their ids and order.")
