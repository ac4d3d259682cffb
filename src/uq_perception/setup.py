from setuptools import find_packages, setup

PACKAGE = 'uq_perception'

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
    description='Detector node with sampling-free NTK-GP uncertainty, NTK-GP engine, `uq` CLI.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'uq = uq_perception.cli:main',
            'detector_node = uq_perception.detector_node:main',
        ],
        # Subcommands of `uq`: the name is the command path with dots ("bench.gp" is
        # `uq bench gp`), the value a function that fills an argparse parser.
        'uq.commands': [
            'bench.gp = uq_perception.gp_benchmark:configure',
            'bench.mnist = uq_perception.mnist_benchmark:configure',
            'bench.node = uq_perception.node_benchmark:configure',
            'build-engine = uq_perception.engine_build:configure',
            'eval.detector = uq_perception.detector_eval:configure',
            'train = uq_perception.training:configure',
        ],
    },
)
