package image

import (
	"context"
	"errors"
)

var errTODO = errors.New("image: not implemented yet")

func open(dir string, opts Options) (*Store, error) { return nil, errTODO }
func (s *Store) importImage(ctx context.Context, src, name string) (*Image, error) {
	return nil, errTODO
}
func (s *Store) get(ctx context.Context, name string) (*Image, error) { return nil, errTODO }
func (s *Store) list(ctx context.Context) ([]Image, error)            { return nil, errTODO }
func (s *Store) remove(ctx context.Context, name string, inUse func(string) (bool, error)) error {
	return errTODO
}
