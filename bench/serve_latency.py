"""Cold vs regenerate vs after-restart latency through `python -m engine serve --model demo` and the
openai client (a 627-token chat; N=max_tokens, default 1). Run: `N=1 .venv/bin/python bench/serve_latency.py`
with OpenBLAS preloaded (scripts/run.sh does it)."""
import os
import signal
import subprocess
import sys
import tempfile
import time

import openai

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
cache = tempfile.mkdtemp(prefix="serve-bench-")
words = ("The prompt cache keeps every layer's keys and values so that a regenerate of an unchanged "
         "conversation forwards only the last prompt token. ")
msgs = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": words * 24 + "Summarise this in one sentence."}]

def spawn():
    p = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--model", "demo", "--port", "0", "--cache-dir", cache],
                         cwd=root, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        if line.startswith("Verbatim server:") and " at http" in line:
            return p, line.split(" at ", 1)[1].split()[0]
    raise SystemExit("no server")

def req(c, n):
    t0 = time.perf_counter()
    r = c.chat.completions.create(model="demo", messages=msgs, temperature=0, seed=0, max_tokens=n, logprobs=True)
    dt = time.perf_counter() - t0
    v = r.verbatim
    return dt, r.usage.prompt_tokens, v["restored"], v["source"], r.choices[0].message.content, [t.logprob for t in r.choices[0].logprobs.content]

out = []
for run in range(2):
    p, url = spawn()
    c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=600)
    for i in range(2 if run == 0 else 1):
        out.append(req(c, int(os.environ.get("N", "1"))))
        print(f"run{run} req{i}: {out[-1][0]*1000:.0f} ms  prompt {out[-1][1]} restored {out[-1][2]} source {out[-1][3]}", flush=True)
    p.send_signal(signal.SIGINT); p.stderr.read(); print("rc", p.wait())
print("identical:", all(o[4] == out[0][4] and o[5] == out[0][5] for o in out))
print(repr(out[0][4]))
