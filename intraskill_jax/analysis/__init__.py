"""Reading a run directory after (or during) training: results, behaviour, training dynamics, the
shareable bundle with its SHA-256 manifest, plots and the offline HTML report.

Nothing here imports JAX or a model: a bundle can be checked and re-analysed on any machine.

    results.py    condition table and paired comparisons of evaluation outcomes (pure functions)
    behaviour.py  tokens per turn, turns, searches, product visits, repairs by outcome
    training.py   metric series (raw and smoothed), group summaries, contributions, funnel
    rundata.py    loading a run directory, collecting what is missing or damaged as problems
    bundle.py     build_bundle / check_bundle / compute_figures
    plots.py      matplotlib figures (SVG and PNG) from figures.json
    site.py       the static offline site from a bundle
    report.py     `intraskill report`: bundle, plots and site in one command
    summary.py    the run's front page as plain text (what quickstart and eval print last)
"""
