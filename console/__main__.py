from console.cli import run

run()
