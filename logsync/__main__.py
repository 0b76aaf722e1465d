from logsync.cli import main

main()
