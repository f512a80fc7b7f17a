"""Reading a run directory after (or during) training: results, behaviour, training dynamics, the
shareable bundle with its SHA-256 manifest, plots and the offline bilingual report.

Nothing here imports JAX or a model: a bundle can be checked, re-analysed and drawn on any machine.

    results.py    condition table and paired comparisons of evaluation outcomes (pure functions)
    behaviour.py  tokens per turn, turns, searches, product visits, repairs by outcome
    training.py   metric series (raw and 5-step mean), group summaries, contributions, funnel
    overview.py   the headline pairs, key counts, protocol numbers, missing controls, trace counts
    rundata.py    loading a run directory, collecting what is missing or damaged as problems
    bundle.py     build_bundle / check_bundle / compute_figures
    plots.py      matplotlib figures (SVG and PNG) from figures.json
    catalog/      every word of the report, one module per language (en.py, zh.py)
    site.py       the static site from a bundle: pages, languages, numbers with their pointers
    front.py      the front page
    chapters.py   chapters 1-3 and 7: method, task and its trace, protocol, reproduce
    evidence.py   chapters 4-6: results, behaviour, optimisation
    report.py     `intraskill report`: bundle, plots and site in one command (or from a bundle alone)
    summary.py    the run's front page as plain text (what quickstart and eval print last)
"""
