#!/usr/bin/env bash
# Launch IntraSkill-JAX training on every worker of a TPU VM pod slice, or on one multi-GPU host.
# `launch_tpu.sh --help` documents every flag; `--dry-run` prints each command instead of running it.
set -euo pipefail

if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
  echo "launch_tpu.sh: error: needs bash >= 4.4 (this is $BASH_VERSION; on macOS: brew install bash)" >&2
  exit 2
fi

usage() {
  cat <<'EOF'
Usage:
  launch_tpu.sh tpu --name TPU --zone ZONE --config FILE --workdir DIR [options] [-- TRAIN_OVERRIDES...]
  launch_tpu.sh gpu --config FILE --workdir DIR [options] [-- TRAIN_OVERRIDES...]

Modes:
  tpu   A TPU VM pod slice, through `gcloud compute tpus tpu-vm ssh/scp --worker=all`: copy this
        checkout (git HEAD) to every worker, install it with jax[tpu], start the rollout server,
        then run the trainer on every worker at once. Each trainer joins the others through
        jax.distributed (INTRASKILL_DISTRIBUTED=auto: JAX reads the slice from the TPU metadata).
  gpu   This machine, one trainer process over all its GPUs: start the rollout server in the
        background, wait until it answers, run the trainer, stop the server.

Required:
  --config FILE        trainer config, relative to the repository root (configs/qwen3_5_4b.py)
  --workdir DIR        run directory. On a pod every worker writes checkpoints there, so use
                       storage all workers share (gs://bucket/run or an NFS mount); a gs://
                       one installs the package with its gcs extra (gcsfs).
  --name TPU           (tpu) the TPU VM name
  --zone ZONE          (tpu) its zone

Rollouts (default: a server started here, which needs --model-path):
  --model-path PATH    HF checkpoint the server loads; also the trainer's initial policy
                       (--config.policy.path). On tpu a path on the workers.
  --sglang             start SGLang (`python -m SGLANG_MODULE`) instead of `intraskill serve`
  --sglang-module MOD  SGLang's launch module (default: sglang.launch_server; sglang-jax on TPU
                       is sgl_jax.launch_server, which has no weight-update endpoint yet)
  --rollout-url URL    use a server that is already running; start none
  --no-server          no server: the trainer samples with its embedded JAX sampler
  --port PORT          server port (default: 30000)
  --server-worker W    (tpu) `all`: a server on every worker, each trainer using its own
                       (default); or a worker number: one server there, bound to 0.0.0.0,
                       used by every trainer through that worker's internal IP
  --server-arg ARG     extra argument for the server (repeatable; e.g. --server-arg=--tp-size=4)
  --server-env K=V     environment of the server (repeatable). A server on a training host
                       shares its accelerators: give each its own (CUDA_VISIBLE_DEVICES,
                       TPU_VISIBLE_CHIPS, --server-arg=--mem-fraction-static=0.4) or serve from
                       the CPU (JAX_PLATFORMS=cpu, small models only)
  --server-timeout S   seconds to wait for the server's /health (default: 1800)

Trainer:
  --train-env K=V      environment of the trainer (repeatable; e.g.
                       XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 next to a GPU server)
  -- ARGS...           passed to `intraskill train` as they are (--config.train.gate_every=10 ...)

Setup:
  --python PY          Python on the hosts (default: python3); commands run as `PY -m ...`,
                       so nothing depends on pip's script directory being on PATH
  --jax-package SPEC   JAX to install (default: jax[tpu] on tpu, jax[cuda12] on gpu)
  --pip-arg ARG        extra `pip install` argument or package (repeatable)
  --project ID         (tpu) gcloud project (default: gcloud's configured one)
  --remote-dir DIR     (tpu) checkout on the workers, relative to the home directory
                       (default: intraskill-jax)
  --skip-copy          (tpu) the workers already have the code in --remote-dir
  --skip-install       (tpu) the workers already have it installed
  --allow-dirty        (tpu) ship HEAD even though tracked files have uncommitted changes
  --detach             (tpu) start the trainers in the background (nohup, output in
                       REMOTE_DIR/train.log on each worker) and return; the server keeps running
  --install            (gpu) pip install -e . with --jax-package first
  --log-dir DIR        (gpu) where the server's log goes (default: logs)

Other:
  --dry-run            print every command (one per line, shell-quoted) and run nothing
  -h, --help           this text

Examples:
  launch_tpu.sh tpu --name my-v5p-64 --zone us-east5-a --config configs/qwen3_5_4b.py \
      --workdir gs://my-bucket/runs/r1 --no-server
  launch_tpu.sh gpu --config configs/qwen3_5_4b.py --workdir runs/r1 --model-path /ckpt/Qwen3.5-4B \
      --sglang --server-env CUDA_VISIBLE_DEVICES=7 --train-env CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6
EOF
}

die() {
  echo "launch_tpu.sh: error: $*" >&2
  echo "Run 'launch_tpu.sh --help' for the flags." >&2
  exit 2
}

# Words that need no quoting in a POSIX shell; anything else is single-quoted.
SAFE_WORD='^[A-Za-z0-9_./:=@%+,-]+$'

# Shell-quotes each argument so the printed line can be pasted back into a shell, and so remote
# commands (one string for ssh) keep paths with spaces or brackets as single words.
quote() {
  local word out=()
  for word in "$@"; do
    if [[ $word =~ $SAFE_WORD ]]; then
      out+=("$word")
    elif [[ $word != *\'* ]]; then
      out+=("'$word'")
    elif [[ $word != *[\$\`\"\\!]* ]]; then
      # Holds single quotes but nothing double quotes would expand: readable as "...".
      out+=("\"$word\"")
    else
      out+=("'${word//\'/\'\\\'\'}'")
    fi
  done
  printf '%s' "${out[*]}"
}

# Runs a command, or prints it under --dry-run.
run() {
  if [[ $DRY_RUN == 1 ]]; then
    printf '%s\n' "$(quote "$@")"
  else
    echo "+ $(quote "$@")" >&2
    "$@"
  fi
}

# A flag's value must be there and must not be the next flag (`--config --dry-run`), except for
# flags whose values are themselves flags (--server-arg=--tp-size=4).
need_value() {
  [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value"
  case $1 in
    --server-arg | --pip-arg) ;;
    *) [[ $2 != -* ]] || die "$1 needs a value, got the flag '$2'" ;;
  esac
}

check_env_word() {
  [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "$1 expects KEY=VALUE, got '$2'"
}

# -- arguments ---------------------------------------------------------------------------------

MODE=""
NAME="" ZONE="" PROJECT="" CONFIG="" WORKDIR="" MODEL_PATH=""
SGLANG=0 SGLANG_MODULE="sglang.launch_server" ROLLOUT_URL="" NO_SERVER=0 PORT=30000
SERVER_WORKER="all" SERVER_TIMEOUT=1800 PYTHON="python3" JAX_PACKAGE="" REMOTE_DIR="intraskill-jax"
SKIP_COPY=0 SKIP_INSTALL=0 ALLOW_DIRTY=0 DETACH=0 INSTALL=0 LOG_DIR="logs" DRY_RUN=0
SERVER_ARGS=() SERVER_ENV=() TRAIN_ENV=() PIP_ARGS=() TRAIN_ARGS=()

if [[ $# -eq 0 ]]; then
  usage >&2
  exit 2
fi
case $1 in
  -h | --help) usage; exit 0 ;;
  tpu | gpu) MODE=$1; shift ;;
  *) die "the first argument is the mode, 'tpu' or 'gpu'; got '$1'" ;;
esac

while [[ $# -gt 0 ]]; do
  # --flag=value and --flag value are both accepted.
  if [[ $1 == --*=* ]]; then
    set -- "${1%%=*}" "${1#*=}" "${@:2}"
  fi
  case $1 in
    -h | --help) usage; exit 0 ;;
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --zone) need_value "$@"; ZONE=$2; shift 2 ;;
    --project) need_value "$@"; PROJECT=$2; shift 2 ;;
    --config) need_value "$@"; CONFIG=$2; shift 2 ;;
    --workdir) need_value "$@"; WORKDIR=$2; shift 2 ;;
    --model-path) need_value "$@"; MODEL_PATH=$2; shift 2 ;;
    --sglang) SGLANG=1; shift ;;
    --sglang-module) need_value "$@"; SGLANG_MODULE=$2; shift 2 ;;
    --rollout-url) need_value "$@"; ROLLOUT_URL=$2; shift 2 ;;
    --no-server) NO_SERVER=1; shift ;;
    --port) need_value "$@"; PORT=$2; shift 2 ;;
    --server-worker) need_value "$@"; SERVER_WORKER=$2; shift 2 ;;
    --server-arg) need_value "$@"; SERVER_ARGS+=("$2"); shift 2 ;;
    --server-env) need_value "$@"; check_env_word "$1" "$2"; SERVER_ENV+=("$2"); shift 2 ;;
    --server-timeout) need_value "$@"; SERVER_TIMEOUT=$2; shift 2 ;;
    --train-env) need_value "$@"; check_env_word "$1" "$2"; TRAIN_ENV+=("$2"); shift 2 ;;
    --python) need_value "$@"; PYTHON=$2; shift 2 ;;
    --jax-package) need_value "$@"; JAX_PACKAGE=$2; shift 2 ;;
    --pip-arg) need_value "$@"; PIP_ARGS+=("$2"); shift 2 ;;
    --remote-dir) need_value "$@"; REMOTE_DIR=$2; shift 2 ;;
    --skip-copy) SKIP_COPY=1; shift ;;
    --skip-install) SKIP_INSTALL=1; shift ;;
    --allow-dirty) ALLOW_DIRTY=1; shift ;;
    --detach) DETACH=1; shift ;;
    --install) INSTALL=1; shift ;;
    --log-dir) need_value "$@"; LOG_DIR=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; TRAIN_ARGS=("$@"); break ;;
    *) die "unknown argument '$1'" ;;
  esac
done

# -- checks (before anything runs) ---------------------------------------------------------------

[[ -n $CONFIG ]] || die "--config is required (a trainer config such as configs/qwen3_5_4b.py)"
[[ -n $WORKDIR ]] || die "--workdir is required (the run directory)"
[[ $PORT =~ ^[0-9]+$ && $PORT -ge 1 && $PORT -le 65535 ]] || die "--port must be 1-65535, got '$PORT'"
[[ $SERVER_TIMEOUT =~ ^[0-9]+$ && $SERVER_TIMEOUT -ge 1 ]] ||
  die "--server-timeout must be a positive number of seconds, got '$SERVER_TIMEOUT'"
if [[ $MODE == tpu ]]; then
  [[ -n $NAME ]] || die "tpu mode needs --name (the TPU VM)"
  [[ -n $ZONE ]] || die "tpu mode needs --zone (the TPU VM's zone)"
  [[ $SERVER_WORKER == all || $SERVER_WORKER =~ ^[0-9]+$ ]] ||
    die "--server-worker must be 'all' or a worker number, got '$SERVER_WORKER'"
  [[ $REMOTE_DIR =~ $SAFE_WORD ]] || die "--remote-dir must be a plain path (letters, digits, ./_-), got '$REMOTE_DIR'"
  [[ $CONFIG != /* && $CONFIG != ..* ]] ||
    die "--config must be a path inside the repository (the workers get the repository, not $CONFIG)"
  : "${JAX_PACKAGE:=jax[tpu]}"
else
  [[ -z $NAME$ZONE$PROJECT ]] || die "--name, --zone and --project are for tpu mode"
  [[ $SKIP_COPY$SKIP_INSTALL$ALLOW_DIRTY$DETACH == 0000 ]] ||
    die "--skip-copy, --skip-install, --allow-dirty and --detach are for tpu mode"
  [[ $SERVER_WORKER == all ]] || die "--server-worker is for tpu mode"
  : "${JAX_PACKAGE:=jax[cuda12]}"
fi
# A gs:// run directory is read and written through gcsfs (the package's `gcs` extra).
PACKAGE_SPEC=.
[[ $WORKDIR != gs://* ]] || PACKAGE_SPEC=".[gcs]"
if [[ $MODE == tpu && $INSTALL == 1 ]]; then
  die "--install is for gpu mode (tpu mode installs unless --skip-install)"
fi
if [[ $NO_SERVER == 1 && -n $ROLLOUT_URL ]]; then
  die "--no-server and --rollout-url exclude each other"
fi
START_SERVER=1
if [[ $NO_SERVER == 1 || -n $ROLLOUT_URL ]]; then
  START_SERVER=0
  [[ $SGLANG == 0 && ${#SERVER_ARGS[@]} -eq 0 && ${#SERVER_ENV[@]} -eq 0 ]] ||
    die "--sglang/--server-arg/--server-env describe a server to start, but --no-server or --rollout-url starts none"
elif [[ -z $MODEL_PATH ]]; then
  die "starting a rollout server needs --model-path (or --rollout-url URL for a running server, or --no-server for the embedded sampler)"
fi

cd "$(dirname "${BASH_SOURCE[0]}")"
[[ -f $CONFIG ]] || die "--config $CONFIG: no such file in $(pwd) (give it relative to the repository root)"

# -- the commands ----------------------------------------------------------------------------------

# The server command on a host, as words.
server_command() {
  local host=$1
  local cmd=()
  [[ ${#SERVER_ENV[@]} -eq 0 ]] || cmd=(env "${SERVER_ENV[@]}")
  if [[ $SGLANG == 1 ]]; then
    cmd+=("$PYTHON" -m "$SGLANG_MODULE")
  else
    cmd+=("$PYTHON" -m intraskill_jax.cli serve)
  fi
  cmd+=(--model-path "$MODEL_PATH" --host "$host" --port "$PORT" "${SERVER_ARGS[@]}")
  printf '%s\0' "${cmd[@]}"
}

# The trainer command, as words; the rollout flags point it at the server this script manages.
train_command() {
  local url=$1
  shift
  local cmd=()
  [[ $# -eq 0 && ${#TRAIN_ENV[@]} -eq 0 ]] || cmd=(env "$@" "${TRAIN_ENV[@]}")
  cmd+=("$PYTHON" -m intraskill_jax.cli train --config "$CONFIG" --workdir "$WORKDIR")
  [[ -z $MODEL_PATH ]] || cmd+=("--config.policy.path=$MODEL_PATH")
  [[ -z $url ]] || cmd+=("--config.rollout.engine=sglang" "--config.rollout.url=$url")
  cmd+=("${TRAIN_ARGS[@]}")
  printf '%s\0' "${cmd[@]}"
}

# A shell loop that waits for a server's /health on this host (url: http://127.0.0.1:PORT, no
# characters a shell would touch).
wait_for_health() {
  local url=$1
  # shellcheck disable=SC2016  # $(seq) belongs to the loop, expanded where it runs
  printf 'for _ in $(seq %d); do curl -sf %s/health >/dev/null && exit 0; sleep 5; done; ' \
    "$(((SERVER_TIMEOUT + 4) / 5))" "$url"
  printf 'echo "no rollout server at %s after %ds; see its log" >&2; exit 1' "$url" "$SERVER_TIMEOUT"
}

tpu_ssh() {
  local worker=$1 command=$2
  run gcloud compute tpus tpu-vm ssh "$NAME" "--zone=$ZONE" "${GCLOUD_PROJECT[@]}" "--worker=$worker" \
    "--command=$command"
}

launch_tpu() {
  GCLOUD_PROJECT=()
  [[ -z $PROJECT ]] || GCLOUD_PROJECT=("--project=$PROJECT")
  local archive="intraskill-src.tar.gz"

  if [[ $SKIP_COPY == 0 ]]; then
    if [[ -n $(git status --porcelain --untracked-files=no) ]]; then
      if [[ $DRY_RUN == 0 && $ALLOW_DIRTY == 0 ]]; then
        die "tracked files have uncommitted changes, and the workers get HEAD; commit them or pass --allow-dirty"
      fi
      echo "launch_tpu.sh: warning: uncommitted changes are not shipped (the workers get HEAD)" >&2
    fi
    local local_archive="${TMPDIR:-/tmp}/$archive"
    run git archive --format=tar.gz "--output=$local_archive" HEAD
    run gcloud compute tpus tpu-vm scp "$local_archive" "$NAME:$archive" "--zone=$ZONE" "${GCLOUD_PROJECT[@]}" \
      --worker=all
    tpu_ssh all "$(quote rm -rf "$REMOTE_DIR") && $(quote mkdir -p "$REMOTE_DIR") && $(quote tar -xzf "$archive" -C "$REMOTE_DIR")"
  fi
  if [[ $SKIP_INSTALL == 0 ]]; then
    tpu_ssh all "cd $REMOTE_DIR && $(quote "$PYTHON" -m pip install -e "$PACKAGE_SPEC" "$JAX_PACKAGE" "${PIP_ARGS[@]}")"
  fi

  local url=$ROLLOUT_URL
  if [[ $START_SERVER == 1 ]]; then
    local bind=127.0.0.1 host=127.0.0.1
    if [[ $SERVER_WORKER != all ]]; then
      # One server for the whole slice: the other workers reach it over the internal network.
      bind=0.0.0.0
      host="<internal IP of worker $SERVER_WORKER>"
      if [[ $DRY_RUN == 0 ]]; then
        host=$(gcloud compute tpus tpu-vm describe "$NAME" "--zone=$ZONE" "${GCLOUD_PROJECT[@]}" \
          "--format=value(networkEndpoints[$SERVER_WORKER].ipAddress)")
        [[ -n $host ]] || die "no worker $SERVER_WORKER in TPU $NAME (gcloud compute tpus tpu-vm describe)"
      else
        run gcloud compute tpus tpu-vm describe "$NAME" "--zone=$ZONE" "${GCLOUD_PROJECT[@]}" \
          "--format=value(networkEndpoints[$SERVER_WORKER].ipAddress)"
      fi
    fi
    url="http://$host:$PORT"
    local server
    mapfile -d '' -t server < <(server_command "$bind")
    # setsid + nohup + no stdin: the server outlives the ssh session that started it.
    tpu_ssh "$SERVER_WORKER" "cd $REMOTE_DIR && setsid nohup $(quote "${server[@]}") > serve.log 2>&1 < /dev/null & echo \$! > serve.pid"
    tpu_ssh "$SERVER_WORKER" "$(wait_for_health "http://127.0.0.1:$PORT")"
    if [[ $DETACH == 0 ]]; then
      trap 'tpu_ssh "$SERVER_WORKER" "kill \$(cat $REMOTE_DIR/serve.pid) || true"' EXIT
    fi
  fi

  local train
  mapfile -d '' -t train < <(train_command "$url" INTRASKILL_DISTRIBUTED=auto)
  if [[ $DETACH == 1 ]]; then
    tpu_ssh all "cd $REMOTE_DIR && setsid nohup $(quote "${train[@]}") > train.log 2>&1 < /dev/null &"
    echo "launch_tpu.sh: trainers started; follow one with: gcloud compute tpus tpu-vm ssh $NAME --zone=$ZONE --worker=0 --command='tail -f $REMOTE_DIR/train.log'" >&2
  else
    tpu_ssh all "cd $REMOTE_DIR && $(quote "${train[@]}")"
  fi
}

launch_gpu() {
  if [[ $INSTALL == 1 ]]; then
    run "$PYTHON" -m pip install -e "$PACKAGE_SPEC" "$JAX_PACKAGE" "${PIP_ARGS[@]}"
  fi
  local url=$ROLLOUT_URL
  if [[ $START_SERVER == 1 ]]; then
    url="http://127.0.0.1:$PORT"
    local server log="$LOG_DIR/serve.log"
    mapfile -d '' -t server < <(server_command 127.0.0.1)
    run mkdir -p "$LOG_DIR"
    if [[ $DRY_RUN == 1 ]]; then
      printf '%s > %s 2>&1 &\n' "$(quote "${server[@]}")" "$(quote "$log")"
    else
      echo "+ $(quote "${server[@]}") > $(quote "$log") 2>&1 &" >&2
      "${server[@]}" > "$log" 2>&1 &
      SERVER_PID=$!
      trap 'kill "$SERVER_PID" 2>/dev/null || true' EXIT
    fi
    run bash -c "$(wait_for_health "$url")"
  fi
  local train
  mapfile -d '' -t train < <(train_command "$url")
  run "${train[@]}"
}

if [[ $MODE == tpu ]]; then
  launch_tpu
else
  launch_gpu
fi
