from samebits.cli import main

main()
