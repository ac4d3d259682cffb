from setuptools import find_packages, setup

PACKAGE = 'uq_sim'

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
    description='MuJoCo tabletop scenes, synthetic datasets, sim camera node.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'sim_camera_node = uq_sim.sim_camera_node:main',
            'sim_robot_node = uq_sim.sim_robot_node:main',
            'scripted_operator_node = uq_sim.scripted_operator_node:main',
            'scripted_labeller_node = uq_sim.scripted_labeller_node:main',
        ],
        # Subcommands of `uq` (uq_common.cli): the name is the command path with dots
        # ("bench.gp" is `uq bench gp`), the value a function that fills an argparse parser.
        'uq.commands': [
            'sim.dataset = uq_sim.commands:configure_dataset',
            'sim.preview = uq_sim.commands:configure_preview',
            'bench.sim = uq_sim.commands:configure_bench',
        ],
    },
)
