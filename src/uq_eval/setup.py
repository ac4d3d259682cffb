from setuptools import find_packages, setup

PACKAGE = 'uq_eval'

setup(
    name=PACKAGE,
    version='0.1.0',
    packages=find_packages(exclude=['test']),
    data_files=[
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
    ],
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='UQ Autonomy Team',
    maintainer_email='team@uq-autonomy.dev',
    description='Demo, training command, detector and bag evaluation, benchmarks.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
        ],
        # Subcommands of `uq` (uq_common.cli): the name is the command path with dots
        # ("bench.gp" is `uq bench gp`), the value a function that fills an argparse parser;
        # each subpackage lists its own in its `commands` module.
        'uq.commands': [
            'demo = uq_eval.closed_loop.commands:demo',
            'train = uq_eval.detector.commands:train',
            'eval.detector = uq_eval.detector.commands:eval_detector',
            'eval.detector-gp = uq_eval.detector.commands:eval_detector_gp',
            'eval.layers = uq_eval.detector.commands:eval_layers',
            'gp.fit = uq_eval.gp.commands:gp_fit',
            'gp.diagnose = uq_eval.gp.commands:gp_diagnose',
            'eval.duplicates = uq_eval.detector.commands:eval_duplicates',
            'eval.tracks = uq_eval.detector.commands:eval_tracks',
            'eval.bag = uq_eval.bags.commands:eval_bag',
            'eval.shared-autonomy = uq_eval.closed_loop.commands:eval_shared_autonomy',
            'eval.help = uq_eval.closed_loop.commands:eval_help',
            'sim.record = uq_eval.bags.commands:sim_record',
            'replay = uq_eval.bags.commands:replay',
            'bench.gp = uq_eval.benchmarks.commands:bench_gp',
            'bench.mnist = uq_eval.mnist.commands:bench_mnist',
            'data.fetch = uq_eval.mnist.commands:data_fetch',
            'bench.node = uq_eval.benchmarks.commands:bench_node',
            'bench.arbitration = uq_eval.benchmarks.commands:bench_arbitration',
            'bench.backend = uq_eval.benchmarks.commands:bench_backend',
            'bench.labels = uq_eval.benchmarks.commands:bench_labels',
        ],
    },
)
