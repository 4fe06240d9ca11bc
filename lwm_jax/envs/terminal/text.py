"""The terminal domain's text: the world model's system prompt and long guidance, the agent's view of
the world and the judge's guidance (read through the domain record, `lwm_jax.domains`)."""

# The system prompt's parts: what is simulated, what an observation is, the default action space
# and demonstration, and the domain's rules, most important first (lwm_jax/data/prompts.py).
PROMPT = dict(
    role="a Linux shell session on a real machine",
    obs="the exact text the command prints to stdout and stderr, nothing else",
    actions="One bash command line per turn, run in the same shell session (state persists).",
    demo="Action: `echo hi > a.txt && wc -c a.txt`\nObservation: `3 a.txt`",
    rules=[
        "A command that succeeds silently (cd, mkdir, cp, export) prints nothing.",
        "The working directory, environment variables and created files persist across turns.",
        "Error messages use the real program's wording, e.g. "
        "`ls: cannot access 'x': No such file or directory`.",
        "Timestamps, sizes, PIDs and versions must look plausible and stay consistent.",
        "Long outputs are shown in full unless the command itself truncates them (head, tail).",
        "Package managers print progress lines the way the real tool does.",
        "Permissions matter: a normal user cannot write to /etc without sudo.",
        "Do not print a shell prompt or echo the command back.",
    ])

# The long prompts' guidance: (heading, points) groups, most important first (data/guidance.py).
GUIDANCE = [
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
]

# What the agent acts on (data/agent_targets.py).
AGENT_WORLD = "a bash shell on a Linux machine"

# The judge's paragraph about this domain's observations (lwm_jax/judge.py).
JUDGE_GUIDANCE = ("Environment: a Linux shell. Much terminal output is deterministic: file contents "
                  "written earlier, echo and printf, listings after known changes, error messages "
                  "and exit codes. Where the reference output is determined by the command and the "
                  "earlier state it must match exactly, character for character; any difference "
                  "lowers factuality. Only genuinely variable parts (times, PIDs, sizes on an "
                  "unknown disk, download progress) may differ if plausible.")
