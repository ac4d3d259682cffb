"""The product speaks of the product: no trace of how it was developed in its files.

Every tracked text file (documentation, sources, tests, configuration, build files) is
searched for phrases that only a development process writes: issue numbers, work sessions
and waves, other agents and their jobs, the development machines' own tools outside the
repository, a design file that is not in the repository, throwaway scripts. The
patterns are narrow on purpose, so that product text (a browser session, the entry helper,
an ``issue`` of a log) cannot match them; each is shown with the text it must catch.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

WORKSPACE = Path(__file__).resolve().parents[1]
#: Pattern -> an example of what it catches (checked below, so the pattern stays alive).
PROCESS_WORDS = {
    r'\bissues? ?#?\d+': 'the targets of issue 20',
    r'\bissue-\d+': 'meets every issue-5 target',
    r'\(issue\b': 'in closed loop (issue 17)',
    r'\b(?:a later|an earlier|this|that|the next|the previous) issue\b':
        'the target of a later issue',
    r'\b(?:this|that|an? earlier|earlier|previous|a later|later|within the) session\b':
        'measured in an earlier session',
    r'\b(?:this|that|previous|next|earlier|later) wave\b': 'earlier in this wave',
    r"\bother agents\b|\bagents' jobs\b|\bdeployment agent\b": "while other agents' jobs ran",
    r'\.\./shared/tools\b': 'build it with ../shared/tools/ros2',
    r'\bfarm-(?:bench|studio)\b': 'timed with farm-bench',
    r'\bdevice tool\b': 'the device tool answers',
    r'(?-i:\bDESIGN\.md\b)': "DESIGN.md's reason",
    r'\bHELPER_BRIEF\b|\banother helper\b': 'another helper adds it',
    r'\bros2-launch-kit\b': 'source /tmp/ros2-launch-kit/bin/activate',
    r'\bthrow-?away (?:script|check|copy)\b': 'measured with a throwaway script',
    r'\bmachine is lent\b|\blent to this\b': 'no GPU was lent to this task',
}
#: Product text the patterns must leave alone.
PRODUCT_TEXT = [
    'a real headless Chromium session', 'the node entry helper', 'see docs/design.md',
    'issue a warning', 'a session cookie', 'shared autonomy', 'the shared memory segment',
    'uq_common is shared infrastructure', 'an issue of the camera driver',
]
TEXT_SUFFIXES = {'.py', '.md', '.msg', '.srv', '.xml', '.yaml', '.yml', '.txt', '.in', '.cfg',
                 '.toml', '.sh', '.rviz', '.sdf', '.json', '.html', '.js', '.css', ''}


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(['git', 'ls-files', '-z'], cwd=WORKSPACE, capture_output=True,
                           check=True).stdout.decode().split('\0')
    files = []
    for name in filter(None, names):
        path = WORKSPACE / name
        if path.suffix in TEXT_SUFFIXES and path.is_file() and path != Path(__file__).resolve():
            files.append(path)
    return files


@pytest.mark.parametrize('pattern', PROCESS_WORDS)
def test_each_pattern_catches_its_example_and_no_product_text(pattern):
    compiled = re.compile(pattern, re.IGNORECASE)
    assert compiled.search(PROCESS_WORDS[pattern])
    assert not [text for text in PRODUCT_TEXT if compiled.search(text)]


def test_no_development_process_words_in_the_repository():
    if not (WORKSPACE / '.git').exists():
        pytest.skip('not a git checkout: the tracked files are unknown')
    patterns = [re.compile(p, re.IGNORECASE) for p in PROCESS_WORDS]
    found = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding='utf-8')
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for pattern in patterns:
                if match := pattern.search(line):
                    found.append(f'{path.relative_to(WORKSPACE)}:{number}: {match.group(0)!r} '
                                 f'in {line.strip()[:100]!r}')
    assert not found, 'development-process words:\n' + '\n'.join(found)


#: Folders beside the workspace are no part of the product: its code and documentation never
#: name them (build glue such as the Makefile may look for them).
BESIDE_THE_WORKSPACE = re.compile(r'\.\./shared\b')
PRODUCT_TREES = ('README.md', 'docs', 'src')


def test_the_product_names_no_folder_beside_the_workspace():
    if not (WORKSPACE / '.git').exists():
        pytest.skip('not a git checkout: the tracked files are unknown')
    assert BESIDE_THE_WORKSPACE.search('read from <workspace>/../shared/data')
    assert not BESIDE_THE_WORKSPACE.search('read from <workspace>/data (shared autonomy)')
    found = []
    for path in _tracked_text_files():
        if path.relative_to(WORKSPACE).parts[0] not in PRODUCT_TREES:
            continue
        text = path.read_text(encoding='utf-8', errors='replace')
        for number, line in enumerate(text.splitlines(), 1):
            if BESIDE_THE_WORKSPACE.search(line):
                found.append(f'{path.relative_to(WORKSPACE)}:{number}: {line.strip()[:100]!r}')
    assert not found, 'names a folder outside the workspace:\n' + '\n'.join(found)
