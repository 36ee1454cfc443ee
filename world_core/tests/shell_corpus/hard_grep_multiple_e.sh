printf 'cat\ndog\nbird\n' | grep -e cat -e bird
