from switchboard_cli.main import main

main()
