from samebits.cli.main import main

main()
