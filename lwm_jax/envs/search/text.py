"""The search domain's text: the world model's system prompt and long guidance, the agent's view of
the world and the judge's guidance (read through the domain record, `lwm_jax.domains`)."""

# The system prompt's parts: what is simulated, what an observation is, the default action space
# and demonstration, and the domain's rules, most important first (lwm_jax/data/prompts.py).
PROMPT = dict(
    role="a web search engine and page fetcher",
    obs="a ranked list of results (title, URL, snippet) or the text of an opened page",
    actions="search(query) returns ranked results; open(url) returns a page's main text.",
    demo='Action: search("boiling point of water at altitude")\n'
         "Observation: 1. Boiling point vs altitude - engineering table ... (snippet)",
    rules=[
        "Results must be relevant to the query wording, including its misspellings.",
        "Facts must be true of the real world; when unsure, return vaguer snippets, not errors.",
        "Snippets are short excerpts; opened pages are longer and consistent with the snippet.",
        "URLs look like real sites and keep the same content when opened again.",
        "Rank the most authoritative and relevant pages first.",
        "Dates and numbers in different results agree unless sources truly disagree.",
        "Pages may contain navigation noise, but the main text dominates.",
        "A query with no good match still returns loosely related results.",
    ])

# The long prompts' guidance: (heading, points) groups, most important first (data/guidance.py).
GUIDANCE = [
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
]

# What the agent acts on (data/agent_targets.py).
AGENT_WORLD = "a full-text search engine over a document collection"

# The judge's paragraph about this domain's observations (lwm_jax/judge.py).
JUDGE_GUIDANCE = ("Environment: web search and page fetching. Observations are result lists (titles, "
                  "URLs, snippets) or page text from the live web. Identical results are not "
                  "expected; judge whether the results answer the query the way real ones do and "
                  "whether specific facts agree with the reference. Invented specifics that the "
                  "reference contradicts lower factuality strongly.")
