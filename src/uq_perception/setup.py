from setuptools import find_packages, setup

PACKAGE = 'uq_perception'

setup(
    name=PACKAGE,
    version='0.1.0',
    packages=find_packages(exclude=['test']),
    data_files=[
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
        # The shipped model, found through the ament index in any install
        # (detectors/model_files.py).
        (f'share/{PACKAGE}/models', ['../../models/detector.pt', '../../models/detector_gp.npz',
                                     '../../models/MODEL_CARD.md']),
    ],
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='UQ Autonomy Team',
    maintainer_email='team@uq-autonomy.dev',
    description='Detector node with NTK-GP uncertainty, the NTK-GP engine, backends, training.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'detector_node = uq_perception.detector_node:main',
        ],
        # Subcommands of `uq` (uq_common.cli): the name is the command path with dots
        # ("bench.gp" is `uq bench gp`), the value a function that fills an argparse parser.
        'uq.commands': [
            'build-engine = uq_perception.runtime.engine_build:configure',
        ],
    },
)
