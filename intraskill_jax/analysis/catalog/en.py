"""The report's English text (see catalog/__init__.py for the conventions)."""

TEXT = {
    # -- frame -------------------------------------------------------------------------------------
    "site.name": "IntraSkill",
    "site.run": "run {name}",
    "site.footer": "Every number on these pages is read from the bundle's figures.json (manifest SHA-256 {sha}…); "
                   "recompute them with `intraskill check-bundle` (see Reproduce).",
    "nav.index": "Overview",
    "nav.method": "Method",
    "nav.task": "Task & reward",
    "nav.protocol": "Protocol",
    "nav.results": "Results",
    "nav.behaviour": "Behaviour",
    "nav.optimisation": "Optimisation",
    "nav.reproduce": "Reproduce",
    "nav.prev": "Previous",
    "link.controls": "the missing controls",
    "link.problems": "listed on the front page",
    "nav.next": "Next",

    # -- chapters: eyebrow, title, lead, and the reading guide's question and summary ----------------
    "ch1.eyebrow": "BACKGROUND & METHOD",
    "ch1.title": "Keep mutable procedures explicit. Train reusable behaviour.",
    "ch1.lead": "A skill is useful because some procedures should stay readable and replaceable, yet stale "
                "guidance can restrict exploration. IntraSkill measures the residual value of small chunks "
                "of guidance while the policy learns under randomised omission.",
    "ch1.question": "Why should a model and its skill co-evolve?",
    "ch1.summary": "Motivation, chunks as the evolving unit, shared group masks, retry and analysts, the paired gate.",
    "ch2.eyebrow": "TASK, ENVIRONMENT & REWARD",
    "ch2.title": "What the agent sees, and how a purchase is scored.",
    "ch2.lead": "Each episode is one shopping task in a simulated shop. The agent searches, reads result and "
                "product pages, picks options and buys; the reward checks the purchase against the task.",
    "ch2.question": "What does the agent see, and how is a purchase scored?",
    "ch2.summary": "Task anatomy, profile, simulator, tools, reward, and one complete shopping trace.",
    "ch3.eyebrow": "PROTOCOL",
    "ch3.title": "What exactly was run.",
    "ch3.lead": "Splits, model, decoding, training denominators, the validation schedule, the config and its "
                "hash, software, machine and the wall time of each stage, all as the run recorded them.",
    "ch3.question": "What exactly was run?",
    "ch3.summary": "Splits, model, decoding, denominators, schedule, config hash, versions, machine, stage times.",
    "ch4.eyebrow": "RESULTS",
    "ch4.title": "What improved, and what remains open.",
    "ch4.lead": "The four test conditions on the same tasks, paired differences with their intervals and "
                "exact McNemar tests, every gate round by round, how the skill evolved, and the "
                "comparisons this run cannot make.",
    "ch4.question": "What improved, and what remains open?",
    "ch4.summary": "Four test conditions, paired intervals, gates, skill evolution, missing controls.",
    "ch5.eyebrow": "BEHAVIOUR",
    "ch5.title": "How the agent's behaviour changes.",
    "ch5.lead": "Generation length, model steps, searches, product visits and repairs, for successes and "
                "failures apart, on the test conditions and on the fixed validation tasks at every gate.",
    "ch5.question": "How does the agent's behaviour change?",
    "ch5.summary": "Generation length, steps of successes and failures, search, product visits, repairs, cases.",
    "ch6.eyebrow": "OPTIMISATION",
    "ch6.title": "What the trainer's logs reveal.",
    "ch6.lead": "Entropy, PPO diagnostics, gradient norms, throughput and truncation, step by step: the "
                "context for the reward curve.",
    "ch6.question": "What do the trainer's logs reveal?",
    "ch6.summary": "Entropy, PPO KL and clipping, gradient norms, throughput and truncation.",
    "ch7.eyebrow": "REPRODUCE",
    "ch7.title": "From evidence to artifacts.",
    "ch7.lead": "The bundle holds every record these pages are drawn from, each with its SHA-256. The "
                "figures and these pages rebuild from it alone, without a GPU or a model.",
    "ch7.question": "How can the evidence be checked?",
    "ch7.summary": "Offline commands, the bundle's files and their hashes, check-bundle.",

    # -- front page -----------------------------------------------------------------------------------
    "front.eyebrow": "AGENTIC RL · RUN REPORT",
    "front.subtitle": "Skill–model co-evolution for shopping agents",
    "front.tagline": "One training run ({run}): a policy learns with GRPO while its external procedural "
                     "skill is measured, revised, and retained where it still helps.",
    "front.model": "{kind}, {params} parameters",
    "front.model_unknown": "policy model not recorded",
    "front.headline_label": "TEST SUCCESS · WITHOUT SKILLS",
    "front.no_headline": "The base and trained policies were not both evaluated without the skill.",
    "front.headline_who": "{model}: base → trained (step {step}), bare prompt",
    "front.headline_delta": "{points} percentage points",
    "front.headline_scope": "{tasks} shared test tasks · {runs} training run",
    "front.count_parameters": "policy parameters",
    "front.count_steps": "rollout steps",
    "front.count_rounds": "evolution rounds",
    "front.count_chunks": "initial → final chunks",
    "front.problems_title": "Incomplete or damaged records",
    "front.problems_lead": "The run directory lacked these or had them damaged when the bundle was built; the "
                           "report shows what is complete.",
    "front.guide_title": "Reading guide",
    "front.guide_lead": "Start with the method, or enter through a specific question. Every chapter is "
                        "available in English and Chinese.",
    "front.eval_title": "Evaluation: the four conditions",
    "front.eval_lead": "All four conditions play the same {tasks} test tasks, one completed rollout per task. "
                       "Strict reward requires every part of the purchase to be right; success requires full credit.",
    "front.flips_title": "{newly} tasks newly succeed",
    "front.flips_title.one": "1 task newly succeeds",
    "front.flips_text": "Comparing the base and the trained policy without the skill, task by task: newly "
                        "succeeding {newly}, regressing {regress}, keeping their outcome {same_ok} + {same_fail} "
                        "(success + failure).",
    "front.skill_title": "The final skill adds {points} points",
    "front.skill_title_not_up": "With the final skill: {points} points",
    "front.skill_text": "The trained policy's success gain from its final skill has a 95% interval of {low} to "
                        "{high} points. A plain-GRPO control and repeated seeds are needed to isolate the benefit "
                        "of co-evolution (see {link}).",
    "front.training_title": "Training dynamics",
    "front.no_training": "No training step was logged.",
    "front.training_lead": "{steps} rollout steps, {rounds} rounds closed by a gate. {generated} episodes were "
                           "generated; {admitted} ({share}) were admitted to the update after zero-variance "
                           "groups were dropped.",
    "front.training_note": "Reward covers every completed, scored episode, filtered groups included. Dashed lines "
                           "mark the gates. The optimisation chapter has the trainer's own diagnostics.",

    # -- shared words ------------------------------------------------------------------------------------
    "eval.none": "No evaluation yet: `eval/outcomes.jsonl` was absent when the bundle was built. Run "
                 "`intraskill eval`, then the report again.",
    "cond.policy.base": "Base",
    "cond.policy.trained": "Trained",
    "cond.policy.pretrained": "Pretrained (zero-shot)",
    "cond.skill.none": "None",
    "cond.skill.initial": "Initial skill S₀ {name}",
    "cond.skill.final": "Final skill Sₜ {name}",
    "outcome.success": "success",
    "outcome.failure": "failure",
    "outcome.all": "all",
    "status.active": "active",
    "action.retain": "retain",
    "action.rewrite": "rewrite",
    "action.add": "add",
    "action.retire": "retire",
    "action.reject": "reject",
    "action.superseded": "superseded",
    "status.retired": "retired",
    "col.reward": "reward",
    "col.reward_named": "reward ({name})",
    "col.strict": "strict reward",
    "col.success": "success",
    "col.model": "model",
    "col.guidance": "guidance",
    "col.condition": "condition",
    "col.tasks": "tasks",
    "col.successes": "successes",
    "col.pair": "a − b",
    "col.newly": "newly succeed",
    "col.regress": "regress",
    "col.both_ok": "both succeed",
    "col.both_fail": "both fail",
    "col.diff": "{outcome}: a − b [95% CI]",
    "col.mcnemar": "McNemar p",
    "col.round": "round",
    "col.step": "step",
    "col.bare": "bare reward",
    "col.random": "random-mask reward",
    "col.full": "full-skill reward",
    "col.gain": "random − bare [95% CI]",
    "col.additivity": "additivity: observed − predicted",
    "col.gate": "gate",
    "col.new_bank": "new bank",
    "col.retain": "retained",
    "col.rewrite": "rewritten",
    "col.add": "added",
    "col.retire": "retired",
    "col.active": "active",
    "col.evidence": "evidence",
    "col.skill": "skill",
    "col.retired_total": "retired in the bank",
    "col.chunk": "chunk",
    "col.title": "title",
    "col.tool": "tool",
    "col.what": "what it is",
    "col.part": "part",
    "col.split": "split",
    "col.used": "used by this run",
    "col.setting": "setting",
    "col.value": "value",
    "col.rollout": "training rollouts",
    "col.eval": "evaluation",
    "col.package": "package",
    "col.stage": "stage",
    "col.times": "times run",
    "col.wall": "wall time",
    "col.detail": "detail",
    "col.ended": "ended (UTC)",
    "col.file": "file",
    "col.bytes": "bytes",
    "col.episodes": "episodes",
    "col.task": "task",
    "col.outcome": "outcome",
    "col.turns": "turns",
    "col.generated": "generated tokens",
    "col.metric": "metric",
    "col.last": "last value",
    "col.mean5": "5-step mean",
    "col.groups": "groups",
    "col.zero_var": "no reward variance",
    "col.retried": "retried",
    "col.skill_free": "skill-free",
    "col.admitted": "admitted",

    # -- figure captions ---------------------------------------------------------------------------------
    "fig.training": "Training reward and success per rollout step (light: raw; solid: 5-step mean; dashed: "
                    "gates) and the episodes generated and admitted to the update at each step.",
    "fig.conditions": "The run's reward, strict reward and success rate in each test condition.",
    "fig.flips": "Outcome flips per paired comparison: newly succeeding, regressing and unchanged tasks.",
    "fig.funnel": "Failure funnel per round: failures, recovered by retry, analysed, proposals, rejected, accepted.",
    "fig.contributions": "Each chunk's contribution estimate β at every gate that tested it, with its 95% interval.",
    "fig.behaviour": "Behaviour per test condition, successes and failures apart.",
    "fig.behaviour_checkpoints": "Behaviour on the fixed validation tasks at every gate's checkpoint, per arm.",
    "fig.optimisation": "The trainer's diagnostics per rollout step (light: raw; solid: 5-step mean; dashed: gates).",

    # -- 01 method ---------------------------------------------------------------------------------------
    "ch1.why_title": "Why co-evolve a policy and its skill",
    "ch1.why": "Shopping tasks share procedures: search with specific words, check the evidence on the "
               "product page, choose every required option, buy only when the price fits. Written down as "
               "a skill, such procedures are readable and can be replaced when they go stale; learned by the "
               "policy, they generalise and need no prompt.\n\n"
               "Neither alone is enough. Guidance that helped an untrained policy may restrict a trained "
               "one, and a policy that always sees the guidance cannot learn to do without it. IntraSkill "
               "trains the policy with GRPO while the skill is measured at fixed intervals: what still helps "
               "the current checkpoint is kept, what no longer helps is rewritten or retired.",
    "ch1.chunk_title": "The chunk is the evolving unit",
    "ch1.chunk": "The skill is a bank of small, scene-level chunks (one procedure each, in English and in "
                 "Chinese) rendered into the system prompt. Each chunk can be switched on or off independently, "
                 "so its contribution can be estimated, and each can be retained, rewritten, added or retired "
                 "on its own.",
    "ch1.initial_bank": "This run started from the bank {name} with {n} active chunks (their texts, round by "
                        "round, are in {link}).",
    "ch1.loop_title": "One training step, and one round",
    "ch1.loop_titles": [
        "Sample a shared context",
        "Update the policy",
        "Investigate failures",
        "Validate and revise",
    ],
    "ch1.loop_texts": [
        "A share of groups is skill-free; every other group samples its chunks by their estimated "
        "contribution. The siblings of a group share one mask, so scaffold exposure never becomes a hidden "
        "difference inside the relative-advantage baseline.",
        "GRPO compares the siblings' rewards under the same context. Groups whose rewards are all equal "
        "carry no signal and are dropped. Only generated tokens carry the loss.",
        "Groups that are wrong in every sibling are retried once with the full skill. The failures that "
        "remain go to the Trace2Skill analysts, which propose additions and rewrites.",
        "At the end of each round the checkpoint is frozen and the gate pairs bare and random-mask "
        "validation on the same tasks, fits each chunk's contribution and decides the next bank.",
    ],
    "ch1.settings": "In this run: {skill_free} of the training groups are skill-free; the others include a chunk "
                    "with probability from its estimate (prior {prior} before any estimate, clipped to "
                    "[{floor}, {ceiling}]). Each step plays {groups} groups of {size} siblings; a gate closes "
                    "each round every {every} steps, {rounds} rounds in all, on {tasks} validation tasks per arm.",
    "ch1.gate_title": "The paired gate",
    "ch1.gate": "Every validation task i is played by the same frozen checkpoint twice with the same sampling "
                "settings: bare (Bᵢ, no skill) and with a random mask Cᵢ in which every chunk and every "
                "pending proposal is on with probability 1/2 (Rᵢ). A third, full-skill arm checks additivity. "
                "The no-intercept main-effect regression above, fitted by OLS with HC3 errors, gives each "
                "column a coefficient βⱼ and an interval.\n\n"
                "A chunk is retained while its coefficient passes the gate's rule; a rewrite replaces its "
                "target only when it scores higher; a proposal is added when it passes; the rest are retired. "
                "With no informative outcomes (every paired difference equal) the gate keeps the bank and "
                "says so.",
    "ch1.meaning_title": "What the coefficients mean, and what they do not",
    "ch1.meaning": "A coefficient is a selection score: the average gain in reward from switching the chunk "
                   "on, at this checkpoint and under this mask distribution. It is not an independent causal "
                   "guarantee: chunks interact, and the full-skill arm's additivity check shows how far the sum "
                   "of the coefficients is from the observed effect of the whole skill. The training-time masks "
                   "are chosen by estimate and are never fed to the regression; only the gate's uniform arm is.",

    # -- 02 task, environment and reward -------------------------------------------------------------------
    "ch2.anatomy_title": "The anatomy of a task",
    "ch2.anatomy": "A task is written for one product of the catalogue: an instruction in the shopper's words "
                   "names the product type, the attributes it must have, the options to choose (size, colour, "
                   "...) and a price cap. The reward checks the purchase against exactly these parts, not "
                   "against the product the task was written for.",
    "task.lead": "The task of the trace below (task {task}):",
    "task.instruction": "instruction",
    "task.attributes": "attributes",
    "task.options": "options",
    "task.price": "price cap",
    "task.category": "category",
    "task.hidden": "requirement held by the profile",
    "task.hidden_value": "{aspect}: {value}",
    "ch2.profile_title": "The shopper's profile",
    "ch2.profile": "Some tasks come with a shopper profile (demographics, spending, interests, recent "
                   "behaviour). In persona mode one requirement is removed from the instruction and kept only in "
                   "the profile, which the agent reads in its prompt: it has to recover the hidden need.",
    "ch2.profile_on": "This run shows the profile (persona mode).",
    "ch2.profile_off": "This run does not show profiles: every requirement is in the instruction.",
    "ch2.env_title": "The simulator and the tools",
    "ch2.env": "The shop is a page machine in the WebShop grammar (mode {mode}). The start page has a search "
               "bar; a search returns ranked results, {page_size} per page (at most {top_n}); a product page "
               "shows its options, price and a Buy Now button. An invalid action changes nothing and the "
               "observation says why; a malformed tool call is a repair, never a crash. An episode ends with "
               "a purchase, after {max_steps} environment steps, or after {max_turns} model turns.",
    "ch2.tool_names": ["search", "click", "ask_shopper"],
    "ch2.tool_texts": [
        "search[keywords] on the start page: BM25 over titles, brands, categories, attributes and options.",
        "click[value]: a result, an option value, Buy Now, Next >, < Prev or Back to Search, as the page shows them.",
        "multi-turn mode only: ask the simulated shopper a question; they answer from the task and the profile.",
    ],
    "ch2.reward_title": "The reward",
    "ch2.reward": "A finished episode is scored on four parts of the purchase. The loose reward gives partial "
                  "credit; the strict reward is their product, so it is 1 only when every part is right; "
                  "success means all four parts are 1. An episode that buys nothing scores 0.",
    "reward.r_type": "1 when the bought product has the task's product type (leaf category); weaker matches score less.",
    "reward.r_att": "share of the task's attributes the product has.",
    "reward.r_option": "share of the task's options among the options selected.",
    "reward.r_price": "1 when the selected variant's price is within the cap.",
    "reward.loose": "r_type × (attribute matches + option matches + r_price) / (attributes + options + 1).",
    "reward.strict": "r_type × r_att × r_option × r_price.",
    "reward.success": "1 when r_type, r_att, r_option and r_price are all 1.",
    "ch2.reward_run": "This run trained on the {name} reward; every table also reports strict reward and success.",
    "ch2.trace_title": "One complete shopping trace",
    "ch2.no_trace": "The bundle holds no trace (an evaluation from before traces were recorded).",
    "ch2.trace_lead": "One test episode as the policy saw it, decoded from its own tokens: the prompt (system "
                      "prompt, any skill text, the first observation), then every turn's reply with its tokens, "
                      "the action it became and the observation appended after it. The reward arrives once, at "
                      "the end. The other recorded episodes are with the behaviour cases.",
    "trace.title": "{condition}, task {task}",
    "trace.summary": "{turns} turns · {tokens} generated tokens · reward {reward}",
    "trace.prompt": "Prompt ({tokens} tokens)",
    "trace.turn": "Turn {n}",
    "trace.reply": "reply, {tokens} tokens",
    "trace.action": "action",
    "trace.repair": "repair: {why}",
    "trace.pieces": "the reply's tokens, one by one",
    "trace.observation": "observation appended, {tokens} tokens",
    "trace.end": "The episode ended with this turn.",
    "trace.end_truncated": "The episode was cut here (turn, context or repair limit).",
    "trace.reward_pending": "reward: none yet (it comes when the episode ends)",
    "trace.reward_final": "reward {reward}: the episode is scored now (below)",
    "trace.reward_title": "Reward at the end of the episode",

    # -- 03 protocol ---------------------------------------------------------------------------------------
    "ch3.splits_title": "Splits",
    "ch3.splits": "The tasks are split once by a seeded permutation: test first, then validation, the rest "
                  "for training. Each split keeps the permutation's order, so any prefix is a uniform sample.",
    "split.train": "train",
    "split.validation": "validation",
    "split.test": "test",
    "split.train_used": "{groups} tasks per step, {size} siblings each",
    "split.validation_used": "the first {tasks} at every gate, in every arm",
    "split.test_used": "the first {tasks}, in every condition",
    "ch3.catalog": "The catalogue holds {products} products and {tasks} tasks.",
    "ch3.no_provenance": "Not recorded: the run directory had no provenance.jsonl (a run from before it was written).",
    "ch3.model_title": "Model and checkpoint",
    "ch3.model_start_path": "The starting policy is the checkpoint at {path}.",
    "ch3.model_start_fresh": "The starting policy is a fresh model with random weights and a tokenizer trained "
                             "on the simulator's text.",
    "ch3.warm_on": "A supervised warm start on oracle demonstrations ran before GRPO.",
    "ch3.warm_off": "No warm start ran: GRPO started from the starting policy.",
    "ch3.no_model": "The policy's config.json and weights were not found when the bundle was built.",
    "model.which": "read from",
    "model.trained": "the trained policy (hf/final)",
    "model.starting": "the starting policy",
    "model.type": "model type",
    "model.architecture": "architecture",
    "model.parameters": "parameters",
    "model.dtypes": "stored values per dtype",
    "ch3.decoding_title": "Decoding",
    "ch3.decoding": "Training rollouts and evaluation sample with the settings below. Evaluation plays each "
                    "task once per condition with the same seed, so outcomes pair task by task.",
    "ch3.agent": "An episode has at most {turns} model turns and {context} tokens of context; each observation "
                 "is cut to {chars} characters.",
    "ch3.denominators_title": "Training denominators",
    "ch3.denominators": "Each step plays {groups} groups of {size} siblings ({per_step} episodes, more when "
                        "all-wrong groups are retried). Over the run {generated} episodes were generated and "
                        "{admitted} ({share}) admitted to the update: groups without reward variance carry no "
                        "advantage and are dropped. The loss aggregates with {aggregation} over the admitted "
                        "episodes' generated tokens.",
    "ch3.schedule_title": "Validation schedule",
    "ch3.schedule": "{rounds} rounds of {every} steps ({steps} steps). At the end of each round the gate "
                    "freezes the checkpoint and plays {tasks} validation tasks in each arm (bare, random mask, "
                    "full skill): the same tasks at every gate, so checkpoints compare task by task.",
    "ch3.config_title": "Config",
    "ch3.config": "The run's resolved config ({name}) is the bundle's config.json, SHA-256 {sha} (every file's "
                  "hash is in {link}).",
    "ch3.config_show": "Show config.json",
    "ch3.software_title": "Software",
    "ch3.software": "Each command that trained or evaluated recorded its software when it started (a resumed "
                    "run records again).",
    "software.commit": "source commit",
    "software.dirty": "(uncommitted changes)",
    "ch3.machine_title": "Machine",
    "machine.platform": "platform",
    "machine.cpus": "CPU cores",
    "machine.memory": "memory (GiB)",
    "machine.devices": "JAX devices",
    "ch3.stages_title": "Wall time of each stage",
    "ch3.stages": "Measured by the run as it went: setup, warm start, each round's training steps "
                  "(checkpoints included), each gate, each evaluated condition.",
    "ch3.no_stages": "No stage times were recorded (a run from before they were).",
    "ch3.stages_each": "Every timed stage",
    "stage.setup": "setup (shop and starting policy)",
    "stage.warm start": "warm start",
    "stage.training": "training steps",
    "stage.gate": "gates",
    "stage.evaluation": "evaluation",
    "stage.total": "total",

    # -- 04 results ---------------------------------------------------------------------------------------
    "ch4.conditions_title": "Four test conditions",
    "ch4.conditions": "The base and the trained policy, each without a skill and with one (the initial bank S₀ "
                      "for the base, the final bank Sₜ for the trained), on the same test tasks with one "
                      "completed rollout per task.",
    "ch4.paired_title": "Paired comparisons",
    "ch4.paired": "Differences a − b on the tasks both conditions played, with paired bootstrap (BCa) 95% "
                  "intervals over tasks; the McNemar test is exact, on the tasks whose outcome flipped.",
    "ch4.gates_title": "Gates, round by round",
    "ch4.no_gate": "No gate has closed a round yet.",
    "ch4.gates": "Each gate's three arms on the same validation tasks at its frozen checkpoint: the gain of the "
                 "random mask over the bare prompt with its interval, the McNemar test of their successes, and "
                 "how far the full skill's effect is from the sum of the coefficients.",
    "ch4.bank_title": "What each gate did to the bank",
    "ch4.bank": "Gate K closes round K and writes round K+1's bank.",
    "ch4.not_written": "not written",
    "evidence.unknown": "not recorded",
    "evidence.yes": "informative: {reason}",
    "evidence.no": "no evidence ({reason}): bank kept",
    "ch4.funnel_title": "Failure funnel",
    "ch4.funnel": "Per round: first-pass failures, those recovered by the retry with the full skill, those "
                  "the analysts read, their proposals, and the proposals the gate rejected or accepted.",
    "funnel.failures": "failures",
    "funnel.recovered_by_retry": "recovered by retry",
    "funnel.analysed": "analysed",
    "funnel.proposals": "proposals",
    "funnel.rejected": "rejected",
    "funnel.accepted": "accepted",
    "ch4.skills_title": "Skill evolution",
    "ch4.no_skills": "No skill round was recorded.",
    "ch4.skills": "Chunks can be retained, rewritten, added or retired; their contribution is specific to a "
                  "checkpoint and a mask distribution, and the bank need not shrink monotonically. Each chunk "
                  "is shown verbatim in both languages, side by side. Scores are selection coefficients, not "
                  "confidence-adjusted estimates.",
    "ch4.round_link": "round {n}",
    "ch4.round_title": "Round {n}: {name}",
    "ch4.ledger": "How this bank came about (the ledger of the gate that closed round {prev})",
    "ch4.not_tested": "not tested by the gate of round {n}",
    "ch4.final_bank": "the final bank: no gate follows round {n} (the trained_skill condition plays it)",
    "ch4.estimate": "gate of round {n}: β {beta} [{low}, {high}], {action}",
    "ch4.revision": "revision {n}",
    "ch4.controls_title": "Missing controls and open questions",
    "ch4.controls": "Written from what this run did and did not include. Each control is a preset of the same "
                    "config; its own run (and bundle) fills the line in.",
    "control.plain_grpo.open": "No plain-GRPO control: the same training without any skill text "
                               "(`--config=...:plain_grpo`). Without it the co-evolution's benefit over plain RL "
                               "is not isolated.",
    "control.plain_grpo.this": "This run is the plain-GRPO control: no skill text was ever shown.",
    "control.fixed_skill.open": "No fixed-skill control: S₀ in every prompt, never evolved (`--config=...:fixed_skill`).",
    "control.fixed_skill.this": "This run is the fixed-skill control: S₀ in every prompt, never evolved.",
    "control.no_mask.open": "No no-mask control: the full current bank in every group, evolution on "
                            "(`--config=...:no_mask`).",
    "control.no_mask.this": "This run is the no-mask control: the full bank in every group.",
    "control.seeds.open": "One training run, one seed: repeated seeds (`intraskill multiseed`) are needed "
                          "before the run-to-run spread is known.",
    "control.seeds.this": "This run is one of several seeds.",
    "question.interval": "The training effect without the skill, {points} points [{low}, {high}], rests on "
                         "{tasks} test tasks with one rollout each: its interval covers sampling over tasks, not "
                         "over training runs.",
    "question.evidence": "{n} of {rounds} gates had no informative outcomes and kept the bank unchanged.",
    "question.always": [
        "The gate's coefficients are selection scores for one checkpoint and one mask distribution, not "
        "independent causal estimates; chunks interact.",
        "Scores use this project's simulator and its frozen splits; they are not a direct comparison with the "
        "original study or the upstream benchmark.",
    ],
    "question.problems": "{n} records of the run directory were incomplete or damaged ({link}).",

    # -- 05 behaviour ---------------------------------------------------------------------------------------
    "ch5.explorer_title": "Behaviour explorer",
    "ch5.explorer": "Means per episode. Test episodes by condition; validation episodes (the same fixed tasks "
                    "at every gate's checkpoint) by round and arm. Filter by source, outcome and group.",
    "explorer.source": "source",
    "explorer.all": "all",
    "explorer.test": "test conditions",
    "explorer.validation": "validation checkpoints",
    "explorer.outcome": "outcome",
    "explorer.all_episodes": "all episodes",
    "explorer.successes": "successes",
    "explorer.failures": "failures",
    "explorer.split": "successes and failures",
    "explorer.group": "group contains",
    "explorer.group_head": "group",
    "explorer.placeholder": "e.g. trained, round 1, random",
    "explorer.empty": "No rows match.",
    "field.tokens_per_turn": "tokens / turn",
    "field.turns": "model steps",
    "field.searches": "searches",
    "field.product_visits": "product visits",
    "field.repairs": "repairs",
    "ch5.measures": "Tokens per turn are the policy's generated tokens over its turns; each episode contributes "
                    "one average. Product visits count arrivals on a product page, not option changes on it. A "
                    "repair is a reply that could not become an action. The outcome groups change with training.",
    "ch5.cases_title": "Cases",
    "ch5.cases": "The recorded test episodes: a success and a failure per condition where there was one, each "
                 "whole below (open one to read it; {link} shows one of them in full).",
    "ch5.read_trace": "read the trace",

    # -- 06 optimisation -------------------------------------------------------------------------------------
    "ch6.logs_title": "Inside the optimiser updates",
    "ch6.logs": "{steps} steps logged; {updated} of the {logged} steps that logged an update changed the "
                "policy (a step whose groups all lacked reward variance has nothing to learn from).",
    "metric.train/entropy": "mean token entropy of the policy on the admitted episodes",
    "metric.train/ppo_kl": "approximate KL between the rollout policy and the updated one",
    "metric.train/clipfrac_low": "share of tokens clipped at the lower ratio bound",
    "metric.train/clipfrac_high": "share of tokens clipped at the upper ratio bound",
    "metric.train/grad_norm": "global gradient norm before clipping",
    "metric.train/tis_clip_frac": "share of tokens whose importance weight hit its cap",
    "metric.perf/rollout_generated_tokens_per_s": "generated tokens per second of rollout",
    "metric.perf/update_tokens_per_s": "tokens per second of the GRPO update",
    "metric.rollout/truncation_rate": "share of episodes cut by a turn, context or step limit",
    "metric.rollout/response_tokens_mean": "generated tokens per episode",
    "ch6.no_update": "No step updated the policy, so the update's diagnostics (entropy, PPO KL, clipping, "
                     "gradient norm) were never logged; what the rollouts logged is below.",
    "ch6.groups_title": "Training groups per step",
    "ch6.groups": "The share of groups without reward variance counts discarded groups, not the prevalence of "
                  "equal-reward outcomes among all episodes.",
    "ch6.last_title": "Every logged metric",
    "ch6.last": "The last value of each of the {n} metrics the run logged",

    # -- 07 reproduce -----------------------------------------------------------------------------------------
    "ch7.commands_title": "Commands",
    "ch7.commands": "RUN is the run directory. Nothing below needs a GPU, a model or a network.",
    "ch7.command_lines": [
        "python3 -m pip install -e .",
        "intraskill report --workdir=RUN                      # bundle, check, plots and these pages",
        "intraskill report --bundle=RUN/bundle --out=REPORT   # the same pages from the bundle alone",
        "intraskill check-bundle RUN/bundle                   # every hash, then every figure recomputed",
        "INTRASKILL_BUNDLE=RUN/bundle jupyter notebook notebooks/analysis.ipynb",
    ],
    "ch7.offline": "The report reads only the bundle: its primary records (config, metrics, groups, gates, "
                   "validation and test episodes, traces, provenance, skill rounds) and the files derived from "
                   "them (contributions, paired outcomes, figures.json).",
    "ch7.files_title": "The bundle's files",
    "ch7.files": "The manifest lists every other file with its size and SHA-256; its own SHA-256 is {manifest}.",
    "file.config": "the run's resolved config",
    "file.problems": "what the run directory lacked or had damaged",
    "file.metrics": "per-step metrics",
    "file.groups": "per-group summaries of the training episodes",
    "file.gates": "every gate: fit, decisions, summary, funnel",
    "file.validation_episodes": "the gates' validation episodes",
    "file.outcomes": "test episodes, one per condition and task",
    "file.traces": "a few test episodes whole, as text",
    "file.provenance": "versions, machine, splits, stage times, the policy's model",
    "file.contributions": "derived: each column's estimate per gate",
    "file.paired_outcomes": "derived: one row per task across conditions",
    "file.figures": "derived: every number these pages show",
    "file.skills": "a round's chunks (English and Chinese) and ledger",
    "ch7.check_title": "Checking the bundle",
    "ch7.check": "`intraskill check-bundle` verifies every file against {manifest} (a missing, truncated or "
                 "altered file is named), then recomputes the derived files from the primary records alone "
                 "and compares every value. Each number on these pages carries the JSON pointer of its value "
                 "in figures.json (the data-fig attribute), so any one can be traced.",
}
