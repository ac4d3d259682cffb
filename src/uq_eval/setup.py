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
        # ("bench.gp" is `uq bench gp`), the value a function that fills an argparse parser.
        'uq.commands': [
            'demo = uq_eval.demo:configure',
            'train = uq_eval.train_command:configure',
            'eval.detector = uq_eval.detector_eval:configure',
            'eval.detector-gp = uq_eval.detector_gp_study:configure',
            'eval.bag = uq_eval.bag_command:configure',
            'eval.shared-autonomy = uq_eval.shared_autonomy_eval:configure',
            'eval.help = uq_eval.help_eval:configure',
            'sim.record = uq_eval.bag_record:configure',
            'replay = uq_eval.bag_replay:configure',
            'bench.gp = uq_eval.gp_benchmark:configure',
            'bench.mnist = uq_eval.mnist_benchmark:configure',
            'bench.node = uq_eval.node_benchmark:configure',
            'bench.arbitration = uq_eval.arbitration_benchmark:configure',
        ],
    },
)
