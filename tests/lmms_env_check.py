"""Run by tests/test_lmms_eval.py with .venv-lmms's Python (lmms-eval 0.7.3): lmms-eval's own task manager on
two `embodied export --format lmms-eval` folders. Prints one JSON line: per group, its tasks with their docs,
metadata, what the chat request of each doc holds (image count and size, text, a digest of the frames) and,
for the answers the spec gives, what lmms-eval's `Task.process_results` makes of them (our hook's rows).

Usage: .venv-lmms/bin/python tests/lmms_env_check.py SPEC.json   (SPEC is written by the test)
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
from lmms_eval.tasks import TaskManager, get_task_dict


def _tasks(tree) -> dict:
    """`{task name: Task}` of get_task_dict's nested `{group: {task: Task}}`."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _tasks(value)
        else:
            out[key if isinstance(key, str) else key.group_name] = value
    return out


def _request(task, doc) -> dict:
    """What the OpenAI chat backend is handed for `doc`: the user turn's parts (lmms-eval's own
    doc_to_messages over our doc_to_visual and doc_to_text)."""
    (message,) = task.doc_to_messages(doc)
    images = [part["url"] for part in message["content"] if part["type"] == "image"]
    texts = [part["text"] for part in message["content"] if part["type"] == "text"]
    frames = np.stack([np.asarray(im) for im in images])
    return {
        "roles": message["role"],
        "order": [part["type"] for part in message["content"]],
        "images": len(images),
        "size": list(frames.shape[1:3]),
        "text": texts,
        "frames_sha256": hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest(),
    }


def main(spec_path: str) -> dict:
    spec = json.loads(Path(spec_path).read_text())
    manager = TaskManager("WARNING", include_path=spec["include_paths"])
    report = {"lmms_eval": version("lmms_eval"), "indexed": {}, "groups": {}}
    for group in spec["groups"]:
        report["indexed"][group] = group in manager.all_groups
        tasks = _tasks(get_task_dict([group], manager, task_type="chat"))
        report["groups"][group] = {
            name: {
                "metadata": task.config.metadata,
                "metrics": [m["metric"] for m in task.config.metric_list],
                "generation_kwargs": task.config.generation_kwargs,
                "docs": {doc["id"]: _request(task, doc) for doc in task.test_docs()},
                "scored": {
                    doc["id"]: task.process_results(doc, [spec["answers"][doc["id"]]])
                    for doc in task.test_docs()
                    if doc["id"] in spec.get("answers", {})
                },
            }
            for name, task in sorted(tasks.items())
        }
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1]), default=str))
